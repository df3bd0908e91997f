"""Hostile connections, over raw sockets: nothing a connection does ends the server, HTTP/2 is
refused as Ollama's Go server refuses it, a half-closed request is a disconnect (never a
500), and at SIGTERM new connections are refused at once while streams in flight finish.

- HTTP/2: hypercorn (which serves the connections the front door hands off) switched to its
  h2 protocol at a prior-knowledge preface or an ``Upgrade: h2c`` request without a body, and
  a stream whose DATA came after the answer raised ``KeyError`` out of it, out of
  ``serve_listeners``, and ended the process.
- Every connection handler runs inside a boundary that logs one line and closes the
  connection, whatever raises.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
import trio
from helpers.hostile_raw import connect, exchange, read_response, read_to_eof, request, status_of

from ollamatrio.engines.simulated import SimulatedBehaviour
from ollamatrio.store import ModelStore, import_gguf

SLOW = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=20)
STREAM = {"model": "tiny", "prompt": "hi", "options": {"num_predict": 40}}  # 2 s at SLOW
H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"
BARE_LF_SHOW = (  # bare-LF line ends: the connection goes to hypercorn
    b'POST /api/show HTTP/1.1\nHost: 127.0.0.1\nContent-Length: 16\n\n{"model":"tiny"}'
)  # fmt: skip


class InFlight:
    """A streamed generation running beside the test: its lines as they come."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.data = bytearray()

    @classmethod
    async def start(cls, url: str) -> InFlight:
        stream = await connect(url)
        await stream.send_all(request("/api/generate", STREAM))
        flight = cls(stream)
        while b'"response"' not in flight.data:  # the first token: it is under way
            flight.data += await stream.receive_some(65536)
        return flight

    async def finish(self) -> list[dict[str, Any]]:
        """Read to the stream's end; its lines, which must end with ``done``."""
        while not self.data.endswith(b"0\r\n\r\n"):
            chunk = await self.stream.receive_some(65536)
            assert chunk, bytes(self.data[-300:])
            self.data += chunk
        await self.stream.aclose()
        body = bytes(self.data).partition(b"\r\n\r\n")[2]
        lines = [json.loads(line) for line in body.split(b"\n") if line.startswith(b"{")]
        lines = [line for line in lines if "load_progress" not in line]
        assert lines[-1]["done"] is True, lines[-1]
        assert "error" not in body.decode()
        return lines


async def still_answers(url: str) -> None:
    data = request("/api/version", method="GET", extra=b"Connection: close\r\n")
    response = await exchange(url, data)
    assert status_of(response) == 200, response


# -- HTTP/2 ------------------------------------------------------------------------------


def h2_request_with_late_body() -> tuple[h2.connection.H2Connection, bytes, bytes]:
    """An HTTP/2 client's preface and a request whose HEADERS announce a 2-byte body that
    comes later (no END_STREAM); and that body's DATA frame."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, [
        (":method", "POST"), (":path", "/api/show"), (":scheme", "http"),
        (":authority", "127.0.0.1"), ("content-length", "2"),
    ])  # fmt: skip
    first = client.data_to_send()
    client.send_data(1, b"{}", end_stream=True)
    return client, first, client.data_to_send()


async def drive_late_body(stream: trio.SocketStream, prefix: bytes = b"") -> bytes:
    """The crash's trigger: preface and HEADERS, wait for the server's answer to that stream
    (HTTP/2) or to the connection (HTTP/1.1), then the body's DATA.  What the server sent
    after ``prefix`` is returned (to its close)."""
    client, first, late = h2_request_with_late_body()
    await stream.send_all(prefix + first)
    answer = bytearray()
    with trio.fail_after(10):
        while True:
            try:
                chunk = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                chunk = b""
            answer += chunk
            if not chunk or answer.startswith(b"HTTP/"):
                break
            events = client.receive_data(chunk)
            if any(isinstance(e, h2.events.ResponseReceived) for e in events):
                break
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(late)
    return bytes(answer) + await read_to_eof(stream)


async def test_http2_triggers_leave_the_server_and_a_stream_in_flight_unharmed(api_server) -> None:
    """The three triggers: the prior-knowledge preface (at the start of a connection, and on
    a connection already handed to hypercorn) with a body that comes after the answer; an
    ``Upgrade: h2c`` request.  HTTP/2 is answered 400 and closed; the upgrade is ignored and
    the request served over HTTP/1.1."""
    with trio.fail_after(60):
        async with api_server(behaviour=SLOW) as srv:
            flight = await InFlight.start(srv.url)

            # 1. The preface at the start: the front door answers it.
            async with await connect(srv.url) as stream:
                answer = await drive_late_body(stream)
            assert status_of(answer) == 400, answer
            assert answer.startswith(b"HTTP/1.1 400 ")
            assert b"HTTP/2 is not supported" in answer
            await still_answers(srv.url)

            # 2. The preface on a connection hypercorn serves (after a chunked request).
            async with await connect(srv.url) as stream:
                answer = await drive_late_body(stream, BARE_LF_SHOW)
            first = await_first_response(answer)
            assert status_of(first) == 200, answer
            assert status_of(answer[len(first) :]) == 400, answer
            await still_answers(srv.url)

            # 3. h2c: the upgrade is ignored (no 101), the request is served over HTTP/1.1,
            # and the connection speaks HTTP/1.1 after it (another upgrade, then HTTP/2).
            upgrade = request("/api/tags", method="GET", extra=H2C)
            async with await connect(srv.url) as stream:
                await stream.send_all(upgrade)
                answer = await read_response(stream)
                assert answer.startswith(b"HTTP/1.1 200 "), answer
                await stream.send_all(upgrade)
                answer = await read_response(stream)
                assert answer.startswith(b"HTTP/1.1 200 "), answer
                answer = await drive_late_body(stream)
                assert status_of(answer) == 400, answer
            # With a body (served by hypercorn as HTTP/1.1 before too).
            data = request("/api/show", {"model": "tiny"}, extra=H2C)
            answer = await exchange(srv.url, data, to_eof=False)
            assert answer.startswith(b"HTTP/1.1 200 "), answer

            await still_answers(srv.url)
            lines = await flight.finish()
            assert len([line for line in lines if not line["done"]]) == 40


def await_first_response(data: bytes) -> bytes:
    """The first response in ``data`` (a ``Content-Length`` body)."""
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    return head + b"\r\n\r\n" + rest[:length]


# -- the boundary --------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["hand-off", "front door"])
async def test_an_error_on_a_connection_closes_it_and_logs_one_line(
    api_server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    """Whatever raises in a connection's handler (here: hypercorn's per-connection server,
    or the front door's own head check) closes that connection with one log line."""
    from ollamatrio.http import front

    class Boom(KeyError):
        pass

    async def raising_handoff(*args: Any) -> None:
        raise Boom(1)

    def raising_check(headers: Any) -> None:
        raise Boom(2)

    if where == "hand-off":
        monkeypatch.setattr(front, "serve_connection", raising_handoff)
        trigger = BARE_LF_SHOW
    else:
        trigger = request("/api/tags", method="GET")
    with trio.fail_after(60):
        async with api_server(behaviour=SLOW) as srv:
            flight = await InFlight.start(srv.url)
            if where == "front door":
                monkeypatch.setattr(front, "head_problem", raising_check)
            caplog.clear()
            assert await exchange(srv.url, trigger) == b""  # closed, nothing written
            monkeypatch.undo()
            await still_answers(srv.url)
            await flight.finish()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].exc_info is None
    assert errors[0].getMessage().startswith("closed a client connection after an error: Boom: ")
    assert errors[0].client == "127.0.0.1"  # type: ignore[attr-defined]


# -- half-close ----------------------------------------------------------------------------


async def test_a_request_then_half_close_is_a_disconnect_not_a_500(
    api_server, caplog: pytest.LogCaptureFixture
) -> None:
    """``shutdown(SHUT_WR)`` after a complete request: Go's server takes the EOF for a client
    that left (it cancels the request), and so does this one: the work stops, nothing is
    written (no 500), and the access line says 499, as for any client that left."""
    caplog.set_level(logging.INFO)
    async with trio.open_nursery() as nursery:
        # A registry that never answers: the pull waits on it until the client leaves.
        serve = partial(trio.serve_tcp, _silent, 0, host="127.0.0.1")
        registry = (await nursery.start(serve))[0]
        port = registry.socket.getsockname()[1]
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        routes = {
            "/api/generate": {**STREAM, "stream": False},
            "/api/chat": {**chat, "stream": False},
            "/v1/chat/completions": chat,
            "/api/embed": {"model": "tiny-embed", "input": "hi"},
            "/api/pull": {"model": f"127.0.0.1:{port}/library/x", "insecure": True},
        }
        with trio.fail_after(60):
            async with api_server(behaviour=SLOW) as srv:
                for path, body in routes.items():
                    caplog.clear()
                    response = await exchange(srv.url, request(path, body), half_close=True)
                    assert b" 500 " not in response, (path, response)
                    assert response == b"", (path, response)
                    lines = [r.getMessage() for r in caplog.records]
                    assert [line for line in lines if re.fullmatch(f"POST {path} 499.*", line)], (
                        path, lines,
                    )  # fmt: skip
                    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], lines
                # Nothing held: every lease was returned.
                assert all(r.refs == 0 for r in srv.scheduler.runners())
                await still_answers(srv.url)
        nursery.cancel_scope.cancel()


async def _silent(stream: trio.SocketStream) -> None:
    await trio.sleep_forever()


# -- SIGTERM: refuse new connections at once ------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="a real server process and its signals")
async def test_at_sigterm_new_connections_are_refused_at_once_and_streams_finish(
    tmp_path: Path, tiny_gguf: Any
) -> None:
    """``python -m ollamatrio serve``: within 0.5 s of SIGTERM a new connection is refused
    (it was accepted into the kernel's backlog and never answered: the process kept a
    duplicate of its listening socket), while a stream in flight runs to its end."""
    store = ModelStore(tmp_path / "models")
    for _ in import_gguf(store, "tiny", tiny_gguf()):
        pass
    env = {
        **os.environ, "OLLAMA_HOST": "127.0.0.1:0", "OLLAMA_MODELS": str(tmp_path / "models"),
        "OLLAMATRIO_ENGINE": "simulated",
        "OLLAMATRIO_SIMULATED_ENGINE": json.dumps({"default": {"load_seconds": 0.01,
                                                               "tokens_per_second": 20}}),
    }  # fmt: skip
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "ollamatrio", "serve"], env=env, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    log = bytearray()
    said: dict[bytes, trio.Event] = {
        b"Listening on": trio.Event(),
        b"received SIGTERM": trio.Event(),
    }

    async def read_log() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.receive_some():
            log.extend(chunk)
            for text, event in said.items():
                if text in log:
                    event.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_log)
            with trio.fail_after(60):
                await said[b"Listening on"].wait()
                url = re.search(rb"Listening on (http://\S+)", log).group(1).decode()  # type: ignore[union-attr]
                flight = await InFlight.start(url)
                proc.send_signal(signal.SIGTERM)
                signalled = trio.current_time()
                await said[b"received SIGTERM"].wait()
                # A connection accepted just before the listener closed is served; after
                # that, every new one is refused.
                while (outcome := await _new_connection(url)) == "200":
                    assert trio.current_time() - signalled < 0.5, "still accepting"
                refused_after = trio.current_time() - signalled
                assert outcome in ("refused", "reset", "503"), outcome
                assert refused_after < 0.5, refused_after
                lines = await flight.finish()
                assert len([line for line in lines if not line["done"]]) == 40
                assert await proc.wait() == 0, log.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
        await proc.stderr.aclose()


async def _new_connection(url: str) -> str:
    """What a new client meets: ``refused`` (connect fails), ``reset`` (closed without an
    answer), ``503``, another status, or ``no answer`` (nothing within 2 s)."""
    try:
        stream = await connect(url)
    except OSError:
        return "refused"
    async with stream:
        with trio.move_on_after(2):
            try:
                await stream.send_all(request("/api/version", method="GET"))
                response = await read_response(stream)
            except (trio.BrokenResourceError, OSError):
                return "reset"
            return str(status_of(response)) if response else "reset"
    return "no answer"
