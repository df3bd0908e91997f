"""The HTTP front door (http/front.py, http/asgi.py) at the byte level: every simple
HTTP/1.1 request served on raw Trio, keep-alive across requests of any kind, the hand-off of
anything else to hypercorn (with the bytes already read), framing it refuses, and idle
connections at shutdown.

Which server answered is visible in the response head: hypercorn adds ``server:
hypercorn-h11``, the front door no ``server`` header."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import trio
from hypercorn.config import Config

from ollamatrio.api.bodies import MAX_JSON_BODY
from ollamatrio.api.models import ApiContext
from ollamatrio.config import Settings
from ollamatrio.devices import SimulatedDevices
from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngineFactory
from ollamatrio.http.asgi import Exchange
from ollamatrio.http.front import RECEIVE_SIZE, serve_http
from ollamatrio.serve import serve
from ollamatrio.store import ModelStore, import_gguf


class Response:
    def __init__(self, status: int, headers: dict[bytes, bytes], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def by_front_door(self) -> bool:
        return b"server" not in self.headers

    def lines(self) -> list[dict[str, Any]]:
        """The NDJSON lines, less the load progress of a first request."""
        lines = [json.loads(line) for line in self.body.splitlines() if line]
        return [line for line in lines if "load_progress" not in line]


class Client:
    """One raw keep-alive connection."""

    def __init__(self, stream: trio.SocketStream, host: bytes) -> None:
        self.stream = stream
        self.host = host
        self.buffer = bytearray()

    @classmethod
    async def open(cls, url: str) -> Client:
        parts = urlsplit(url)
        assert parts.hostname is not None
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
        return cls(stream, parts.netloc.encode())

    def request(self, path: str, body: Any = None, *, method: str = "POST",
                extra: bytes = b"") -> bytes:  # fmt: skip
        data = b"" if body is None else json.dumps(body).encode()
        return (
            b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n%s"
            % (method.encode(), path.encode(), self.host, len(data), extra, data)
        )

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        assert data, "the server closed the connection"
        self.buffer += data

    async def _take(self, size: int) -> bytes:
        while len(self.buffer) < size:
            await self._fill()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            await self._fill()
        line, _, _ = bytes(self.buffer).partition(b"\r\n")
        del self.buffer[: len(line) + 2]
        return line

    async def response(self) -> Response:
        head = await self.response_to_head()
        status, headers = head.status, head.headers
        if headers.get(b"transfer-encoding") == b"chunked":
            body = bytearray()
            while size := int(await self._line(), 16):
                body += await self._take(size)
                assert await self._take(2) == b"\r\n"
            assert await self._take(2) == b"\r\n"
            return Response(status, headers, bytes(body))
        if b"content-length" in headers:
            return Response(status, headers, await self._take(int(headers[b"content-length"])))
        while b'"done":true' not in self.buffer:  # HTTP/1.0: a native stream, to its end
            await self._fill()
        body = bytes(self.buffer)
        self.buffer.clear()
        return Response(status, headers, body)

    async def response_to_head(self) -> Response:
        """The status and headers of a response whose body does not follow (HEAD) or is
        left unread (a stream)."""
        status = int((await self._line()).split(b" ")[1])
        headers: dict[bytes, bytes] = {}
        while line := await self._line():
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return Response(status, headers, b"")

    async def exchange_raw(self, request: bytes) -> Response:
        await self.send(request)
        return await self.response()

    async def exchange(self, path: str, body: Any = None, **kwargs: Any) -> Response:
        await self.send(self.request(path, body, **kwargs))
        return await self.response()

    async def closed(self) -> bool:
        """Whether the server closes the connection (without sending anything more)."""
        return not self.buffer and await self.stream.receive_some(65536) == b""


GENERATE = {"model": "tiny", "prompt": "hi", "options": {"num_predict": 3}}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}


async def test_one_connection_carries_many_generations(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                for _ in range(3):
                    r = await client.exchange("/api/generate", GENERATE)
                    assert r.status == 200
                    assert r.by_front_door
                    assert r.lines()[-1]["done"] is True
                    assert len(r.lines()) == 4
                    r = await client.exchange("/api/chat", CHAT)
                    assert r.status == 200
                    assert r.by_front_door
                    assert r.headers[b"content-length"] == b"%d" % len(r.body)
                    assert r.lines()[0]["message"]["role"] == "assistant"
                    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True}
                    r = await client.exchange("/v1/completions", body)
                    assert r.status == 200
                    assert r.body.endswith(b"data: [DONE]\n\n")


async def test_mixed_requests_stay_in_the_front_door(api_server) -> None:
    """As the official clients use one pooled connection: catalog calls between chats."""
    with trio.fail_after(30):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                r = await client.exchange("/api/tags", method="GET")
                assert (r.status, r.by_front_door) == (200, True)
                assert {m["name"] for m in json.loads(r.body)["models"]} >= {"tiny:latest"}
                r = await client.exchange("/api/generate", GENERATE)
                assert (r.status, r.by_front_door) == (200, True)
                assert r.lines()[-1]["done"] is True
                r = await client.exchange("/api/show", {"model": "tiny"})
                assert (r.status, r.by_front_door) == (200, True)
                assert "details" in json.loads(r.body)
                r = await client.exchange("/api/chat", {**CHAT, "stream": True})
                assert (r.status, r.by_front_door) == (200, True)
                assert r.lines()[-1]["done"] is True
                r = await client.exchange("/api/ps", method="GET")
                assert (r.status, r.by_front_door) == (200, True)
                r = await client.exchange("/api/generate?x=%20", GENERATE)
                assert (r.status, r.by_front_door) == (200, True)
                r = await client.exchange("/metrics", method="GET")
                assert (r.status, r.by_front_door) == (200, True)
                assert b'endpoint="/api/show"' in r.body  # Quart's request counting ran


async def test_head_and_unknown_paths(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                got = await client.exchange("/api/tags", method="GET")
                await client.send(b"HEAD /api/tags HTTP/1.1\r\nHost: %s\r\n\r\n" % client.host)
                head = await client.response_to_head()
                assert (head.status, head.by_front_door) == (200, True)
                assert head.headers[b"content-length"] == b"%d" % len(got.body)
                # No body came: the next answer on the connection parses from its first byte.
                r = await client.exchange("/nope", method="GET")
                assert (r.status, r.by_front_door) == (404, True)
                r = await client.exchange("/api/tags", method="PUT")
                assert (r.status, r.by_front_door) == (405, True)
                r = await client.exchange("/", method="GET")
                assert (r.status, r.body) == (200, b"Ollama is running")


async def test_a_streamed_create_goes_through_the_adapter(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                r = await client.exchange("/api/create", {"model": "new", "from": "tiny"})
                assert (r.status, r.by_front_door) == (200, True)
                assert r.headers[b"transfer-encoding"] == b"chunked"
                assert r.lines()[-1] == {"status": "success"}
                r = await client.exchange("/api/show", {"model": "new"})
                assert (r.status, r.by_front_door) == (200, True)


async def test_an_events_stream_ends_when_its_client_leaves(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                await client.send(b"GET /api/events HTTP/1.1\r\nHost: %s\r\n\r\n" % client.host)
                head = await client.response_to_head()  # at once, before any event
                assert (head.status, head.by_front_door) == (200, True)
                assert head.headers[b"transfer-encoding"] == b"chunked"
                await srv.scheduler.events.wait_subscribers(1)
            await srv.scheduler.events.wait_subscribers(0)


async def test_a_blob_upload_is_streamed_in_pieces(api_server, monkeypatch) -> None:
    pieces: list[int] = []
    receive = Exchange.receive

    async def counting(self: Exchange) -> dict[str, Any]:
        message = await receive(self)
        if message["type"] == "http.request":
            pieces.append(len(message["body"]))
        return message

    monkeypatch.setattr(Exchange, "receive", counting)
    data = os.urandom(4 << 20)
    digest = b"sha256:" + hashlib.sha256(data).hexdigest().encode()
    with trio.fail_after(30):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                await client.send(
                    b"POST /api/blobs/%s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n"
                    % (digest, client.host, len(data))
                )
                await client.send(data)
                r = await client.response()
                assert (r.status, r.by_front_door) == (201, True)
                assert sum(pieces) == len(data)
                assert max(pieces) <= RECEIVE_SIZE  # never the whole body at once
                await client.send(
                    b"HEAD /api/blobs/%s HTTP/1.1\r\nHost: %s\r\n\r\n" % (digest, client.host)
                )
                head = await client.response_to_head()
                assert (head.status, head.by_front_door) == (200, True)


async def test_a_route_that_raises_is_500(api_server, monkeypatch) -> None:
    async def broken(self: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(ApiContext, "list_models", broken)
    with trio.fail_after(30):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                r = await client.exchange("/api/tags", method="GET")
                assert (r.status, r.by_front_door) == (500, True)
                assert "error" in json.loads(r.body)
                r = await client.exchange("/api/version", method="GET")  # still usable
                assert (r.status, r.by_front_door) == (200, True)


async def test_unusual_requests_go_to_hypercorn(api_server) -> None:
    """HTTP/1.0 and chunked bodies are the front door's; pipelined requests hypercorn's."""
    with trio.fail_after(30):
        async with api_server() as srv:
            host = urlsplit(srv.url).netloc.encode()
            data = json.dumps(GENERATE).encode()
            plain = Client(None, host).request("/api/generate", GENERATE)  # type: ignore[arg-type]
            requests = [
                (plain.replace(b"HTTP/1.1", b"HTTP/1.0", 1), True),
                (
                    b"POST /api/generate HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n"
                    b"\r\n%x\r\n%s\r\n0\r\n\r\n" % (host, len(data), data),
                    True,
                ),
                (plain * 2, False),  # pipelined
            ]
            for raw, here in requests:
                client = await Client.open(srv.url)
                async with client.stream:
                    await client.send(raw)
                    for _ in range(raw.count(b"POST")):
                        r = await client.response()
                        assert (r.status, r.by_front_door) == (200, here), raw
                        assert r.lines()[-1]["done"] is True


async def test_an_oversize_head_is_hypercorns_to_judge(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                extra = b"X-Filler: %s\r\n" % (b"a" * 20000)
                r = await client.exchange("/api/generate", GENERATE, extra=extra)
                assert not r.by_front_door


async def test_an_oversize_body_is_413_without_being_read(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv:
            for path, shape in (("/api/generate", "error"), ("/v1/chat/completions", "error")):
                client = await Client.open(srv.url)
                async with client.stream:
                    # Part of the body is on its way when the answer comes: the server
                    # must not reset the connection before the client has read it.
                    await client.send(
                        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s"
                        % (path.encode(), client.host, MAX_JSON_BODY + 1, b" " * 100_000)
                    )
                    r = await client.response()
                    assert (r.status, r.by_front_door) == (413, True)
                    assert shape in json.loads(r.body)
                    assert r.headers[b"connection"] == b"close"
                    assert await client.closed()


async def test_ambiguous_framing_is_refused(api_server) -> None:
    heads = [
        b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
        b"Content-Length: 2\r\nContent-Length: 3\r\n",
        b"Content-Length: -2\r\n",
        b"Content-Length: 0x10\r\n",
    ]
    with trio.fail_after(30):
        async with api_server() as srv:
            for framing in heads:
                client = await Client.open(srv.url)
                async with client.stream:
                    await client.send(
                        b"POST /api/generate HTTP/1.1\r\nHost: %s\r\n%s\r\n{}"
                        % (client.host, framing)
                    )
                    r = await client.response()
                    assert r.status == 400, framing
                    assert await client.closed()


async def test_a_bare_lf_head_is_answered_at_once(api_server) -> None:
    """h11 reads bare-LF line ends: such a head goes to hypercorn as soon as it is complete
    (it used to wait for a CRLF blank line until the keep-alive timeout, 30 s)."""
    with trio.fail_after(30):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                with trio.fail_after(10):
                    r = await client.exchange_raw(
                        b"GET /api/version HTTP/1.1\nHost: %s\n\n" % client.host
                    )
                assert (r.status, r.by_front_door) == (200, False)
                assert "version" in json.loads(r.body)
            client = await Client.open(srv.url)
            async with client.stream:
                with trio.fail_after(10):
                    r = await client.exchange_raw(
                        b"GET /api/version HTTP/1.1\r\nHost: %s\r\n\n" % client.host
                    )
                assert (r.status, r.by_front_door) == (200, False)


async def test_what_h11_refuses_is_not_served_here(api_server) -> None:
    """Two Host headers: h11 (hypercorn) answers 400, so the front door does not serve it."""
    with trio.fail_after(30):
        async with api_server() as srv:
            for eol in (b"\r\n", b"\n"):
                client = await Client.open(srv.url)
                async with client.stream:
                    with trio.fail_after(10):
                        r = await client.exchange_raw(
                            b"GET /api/version HTTP/1.1%sHost: a%sHost: b%s%s"
                            % (eol, eol, eol, eol)
                        )
                    assert (r.status, r.by_front_door) == (400, False)


async def test_bad_json_and_connection_close(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                await client.send(
                    b"POST /api/chat HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\n\r\n{nope"
                    % client.host
                )
                r = await client.response()
                assert (r.status, r.by_front_door) == (400, True)
                assert "error" in json.loads(r.body)
                # The connection is still good for the next request, which asks to close it.
                r = await client.exchange("/api/generate", GENERATE, extra=b"Connection: close\r\n")
                assert (r.status, r.by_front_door) == (200, True)
                assert r.headers[b"connection"] == b"close"
                assert await client.closed()


async def test_an_idle_connection_closes_after_the_keep_alive_timeout(
    autojump_clock: trio.abc.Clock, api_server
) -> None:
    autojump_clock.autojump_threshold = 0.1  # type: ignore[attr-defined]
    with trio.fail_after(100):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                r = await client.exchange("/api/generate", GENERATE)
                assert (r.status, r.by_front_door) == (200, True)
                idle_since = trio.current_time()
                assert await client.closed()
                assert 29 < trio.current_time() - idle_since < 31


async def test_shutdown_closes_idle_connections_at_once(tmp_path: Path, tiny_gguf) -> None:
    settings = Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models")
    store = ModelStore(settings.models_dir)
    for _ in import_gguf(store, "tiny", tiny_gguf()):
        pass
    devices = SimulatedDevices(json.dumps({"gpus": [], "system": {"total": 64 << 30}}))
    engines = SimulatedEngineFactory(devices, default=SimulatedBehaviour(load_seconds=0.01))
    stop = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            (url,) = await nursery.start(
                partial(serve, settings, shutdown_trigger=stop.wait, engines=engines,
                        devices=devices)
            )  # fmt: skip
            ours = await Client.open(url)
            async with ours.stream:
                r = await ours.exchange("/api/generate", GENERATE)
                assert (r.status, r.by_front_door) == (200, True)
                stop.set()
                # Well before the keep-alive timeout (30 s) and the grace period (10 s).
                with trio.fail_after(5):
                    assert await ours.closed()
                # (hypercorn closes its idle connections when the grace period ends)


async def test_expect_100_continue_as_curl_sends_it(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv:
            client = await Client.open(srv.url)
            async with client.stream:
                head, _, body = client.request(
                    "/api/generate", GENERATE, extra=b"Expect: 100-continue\r\n"
                ).partition(b"\r\n\r\n")
                await client.send(head + b"\r\n\r\n")
                assert await client._line() == b"HTTP/1.1 100 Continue"
                assert await client._line() == b""
                await client.send(body)
                r = await client.response()
                assert (r.status, r.by_front_door) == (200, True)
                assert r.lines()[-1]["done"] is True


class RawApp:
    """A plain ASGI app that records the scopes it gets; ``/raise`` raises before answering."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.scopes.append(scope)
        if scope["path"] == "/raise":
            raise RuntimeError("boom")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@asynccontextmanager
async def raw_server(app: RawApp) -> AsyncIterator[str]:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        (url,) = await nursery.start(partial(serve_http, app, config, shutdown_trigger=stop.wait))
        yield url
        stop.set()


async def test_the_scope_is_hypercorns(caplog) -> None:
    app = RawApp()
    with trio.fail_after(30):
        async with raw_server(app) as url:
            ours = await Client.open(url)
            async with ours.stream:
                request = (
                    b"GET /a%%20b/%%C3%%A9?x=1&y=%%20 HTTP/1.1\r\nHost: %s\r\nX-Thing: Yes\r\n\r\n"
                    % ours.host
                )
                r = await ours.exchange_raw(request)
                assert (r.status, r.body, r.by_front_door) == (200, b"ok", True)
                # Two requests at once (pipelined) are hypercorn's.
                theirs = await Client.open(url)
                async with theirs.stream:
                    await theirs.send(request * 2)
                    for _ in range(2):
                        r = await theirs.response()
                        assert (r.status, r.body, r.by_front_door) == (200, b"ok", False)
                # An app that raises before answering: 500, and the connection closes.
                r = await ours.exchange("/raise", method="GET")
                assert (r.status, r.body, r.by_front_door) == (500, b"", True)
                assert r.headers[b"connection"] == b"close"
                assert await ours.closed()
    front, hyper = app.scopes[0], app.scopes[1]
    assert front["path"] == "/a b/é"
    for scope in (front, hyper):
        del scope["client"]  # another port
        del scope["asgi"]  # hypercorn says spec 2.1 (it supports less than it has)
    assert front == hyper
    assert "boom" in caplog.text
