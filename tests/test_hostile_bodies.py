"""Hostile clients and request bodies: a body that stalls is answered 408 and closed after
the body timeout (``OLLAMATRIO_BODY_TIMEOUT``) on every path and framing, a malformed
chunked body 400; and a server whose descriptors are all taken by stalled bodies keeps
answering once they time out, logging a line a second rather than a traceback per accept.

Everything is driven over raw sockets, as such a client would."""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio
from conftest import import_model
from test_front import GENERATE, Client

from ollamatrio.http.asgi import ANSWERED, Exchange
from ollamatrio.http.http1 import Head
from ollamatrio.store import ModelStore

BODY_TIMEOUT = 0.5  # seconds, for the servers here


async def read_to_close(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = bytearray()
    while chunk := await stream.receive_some(65536):
        data += chunk
    return bytes(data)


def stalled_requests(host: bytes) -> dict[str, bytes]:
    """Requests whose bodies stop after a byte or so, one for each path and framing."""
    zeros = b"sha256:" + b"0" * 64
    return {
        "a Quart route, Content-Length": (
            b"POST /api/show HTTP/1.1\r\nHost: %s\r\nContent-Length: 100\r\n\r\n{" % host
        ),
        "a generation route, Content-Length": (
            b"POST /api/generate HTTP/1.1\r\nHost: %s\r\nContent-Length: 100\r\n\r\n{" % host
        ),
        "a blob upload": (
            b"POST /api/blobs/%s HTTP/1.1\r\nHost: %s\r\nContent-Length: 100000\r\n\r\nxx"
            % (zeros, host)
        ),
        "a generation route, chunked": (
            b"POST /api/generate HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"64\r\n{" % host
        ),
        "a Quart route, chunked, between chunks": (
            b"POST /api/show HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"1\r\n{\r\n" % host
        ),
        "HTTP/1.0, Content-Length": (
            b"POST /api/generate HTTP/1.0\r\nContent-Length: 100\r\n\r\n{"
        ),
        "after 100 Continue": (
            b"POST /api/chat HTTP/1.1\r\nHost: %s\r\nExpect: 100-continue\r\n"
            b"Content-Length: 100\r\n\r\n" % host
        ),
        # Bare-LF line ends: the connection is hypercorn's.
        "hypercorn, a Quart route": (
            b"POST /api/show HTTP/1.1\nHost: %s\nContent-Length: 100\n\n{" % host
        ),
        "hypercorn, a generation route": (
            b"POST /api/generate HTTP/1.1\nHost: %s\nContent-Length: 100\n\n{" % host
        ),
    }  # fmt: skip


async def test_a_stalled_body_is_408_and_closed_on_every_path(api_server: Any) -> None:
    async with api_server(body_timeout=BODY_TIMEOUT) as srv:
        host = urlsplit(srv.url).netloc.encode()
        requests = stalled_requests(host)
        answers: dict[str, tuple[bytes, float]] = {}

        async def stall(name: str, request: bytes) -> None:
            client = await Client.open(srv.url)
            async with client.stream:
                await client.send(request)
                started = trio.current_time()
                answers[name] = (await read_to_close(client.stream), trio.current_time() - started)

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for name, request in requests.items():
                    nursery.start_soon(stall, name, request)
        for name, (answer, seconds) in answers.items():
            if name == "after 100 Continue":
                assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), answer
                answer = answer.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 408 "), (name, answer)
            assert b"connection: close" in answer.lower(), (name, answer)
            assert answer.endswith(b"no byte for 0.5s"), (name, answer)
            assert BODY_TIMEOUT <= seconds < BODY_TIMEOUT + 2, (name, seconds)
        # Nothing of them was left behind: no blob, the server answers.
        client = await Client.open(srv.url)
        async with client.stream:
            r = await client.exchange("/api/tags", method="GET")
            assert r.status == 200


async def test_a_body_that_keeps_coming_is_not_cut(api_server: Any) -> None:
    """The timeout is for silence, not for the whole body: a slow but steady upload ends."""
    data = json.dumps(GENERATE).encode()
    async with api_server(body_timeout=BODY_TIMEOUT) as srv:
        client = await Client.open(srv.url)
        async with client.stream:
            with trio.fail_after(20):
                await client.send(
                    b"POST /api/generate HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n"
                    % (client.host, len(data))
                )
                for i in range(0, len(data), len(data) // 4 + 1):  # 5 pieces, 1.2 s in all
                    await trio.sleep(BODY_TIMEOUT * 0.6)
                    await client.send(data[i : i + len(data) // 4 + 1])
                r = await client.response()
                assert r.status == 200
                assert r.lines()[-1]["done"] is True


async def test_a_malformed_chunked_body_is_400_and_closed(api_server: Any) -> None:
    async with api_server() as srv:
        for body in (
            b"zz\r\n{}\r\n0\r\n\r\n",
            b"2\r\n{}XX0\r\n\r\n",
            b"2\r\n{}\r\n0\r\nbad\r\n\r\n",
        ):
            client = await Client.open(srv.url)
            async with client.stream:
                await client.send(
                    b"POST /api/show HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n%s"
                    % (client.host, body)
                )
                with trio.fail_after(10):
                    answer = await read_to_close(client.stream)
                assert answer.startswith(b"HTTP/1.1 400 "), (body, answer)


async def test_a_chunked_blob_upload_is_read_in_pieces(api_server: Any) -> None:
    """A chunked upload in the front door: its digest checked, the blob stored."""
    data = os.urandom(300_000)
    digest = b"sha256:" + hashlib.sha256(data).hexdigest().encode()
    async with api_server() as srv:
        client = await Client.open(srv.url)
        async with client.stream:
            await client.send(
                b"POST /api/blobs/%s HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
                % (digest, client.host)
            )
            for i in range(0, len(data), 70_000):
                piece = data[i : i + 70_000]
                await client.send(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece))
            await client.send(b"0\r\nX-Trailer: ignored\r\n\r\n")
            with trio.fail_after(10):
                r = await client.response()
            assert (r.status, r.by_front_door) == (201, True)
            r = await client.exchange("/api/version", method="GET")  # kept alive
            assert r.status == 200
    assert srv.store.blob_path(digest.decode()).read_bytes() == data


# -- the deadline itself, on trio's clock ----------------------------------------------------


class FakeConnection:
    """Just enough of ``front._Connection`` for one exchange: nothing ever arrives."""

    client = ("127.0.0.1", 1)
    server = ("127.0.0.1", 2)
    root_path = ""
    state: dict[str, Any] = {}  # noqa: RUF012
    stopping = False

    def __init__(self, body_timeout: float) -> None:
        self.buffer = bytearray(b"{")
        self.eof = False
        self.broken = False
        self.linger = False
        self.body_timeout = body_timeout
        self.written = bytearray()

    async def write(self, data: bytes) -> None:
        self.written += data

    async def receive(self) -> None:
        await trio.sleep_forever()

    async def wait_for_eof(self) -> None:
        await trio.sleep_forever()


async def test_the_body_deadline_is_silence_for_body_timeout(autojump_clock: Any) -> None:
    connection = FakeConnection(body_timeout=30.0)
    head = Head("POST", b"/api/show", [(b"host", b"x")], 10, False, False)
    exchange = Exchange(connection, head)
    first = await exchange.receive()
    assert first == {"type": "http.request", "body": b"{", "more_body": True}
    started = trio.current_time()
    with trio.fail_after(3600):
        assert await exchange.receive() == {"type": "http.disconnect", ANSWERED: 408}
    assert trio.current_time() - started == pytest.approx(30.0)
    assert connection.written.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert connection.linger  # the rest of the body is unread: closing says so first
    assert not exchange.keep_alive()
    # What the app answers now goes nowhere: the client has its answer.
    await exchange.send({"type": "http.response.start", "status": 200, "headers": []})
    await exchange.send({"type": "http.response.body", "body": b"late"})
    assert b"late" not in connection.written
    assert connection.written.count(b"HTTP/1.1") == 1


# -- descriptors taken by stalled bodies -----------------------------------------------------

SOFT_LIMIT = 1024
STALLED = 1100
# Long enough for all the clients to connect before the first bodies time out and give their
# descriptors back, however fast this machine accepts (the listen backlog holds 100).
SERVE_BODY_TIMEOUT = 10


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="a Linux open file limit")
async def test_stalled_bodies_on_every_descriptor_time_out_and_the_log_stays_small(
    tmp_path: Path, tiny_gguf: Any
) -> None:
    """1,100 clients that send a head and one byte of body, against ``python -m ollamatrio
    serve`` under a limit of 1,024 open files (soft and hard) and a connection cap above it
    (so that accepting runs out of descriptors): within the body timeout the stalled
    clients get 408 and their descriptors back, a new request is answered, and the log grows
    by less than 200 KB (one line a second while accepting fails, not a traceback each)."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < STALLED + 200:
        pytest.skip("this test process cannot open 1,100 client sockets")
    store = ModelStore(tmp_path / "models")
    await trio.to_thread.run_sync(import_model, store, "tiny", tiny_gguf())
    env = {**os.environ, "OLLAMA_HOST": "127.0.0.1:0", "OLLAMA_MODELS": str(tmp_path / "models"),
           "OLLAMATRIO_ENGINE": "simulated", "OLLAMATRIO_BODY_TIMEOUT": f"{SERVE_BODY_TIMEOUT}s",
           "OLLAMATRIO_MAX_CONNECTIONS": "2000"}  # fmt: skip

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_LIMIT, SOFT_LIMIT))

    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "ollamatrio", "serve"], env=env, stderr=subprocess.PIPE,
        preexec_fn=low_limit, cwd=tmp_path,
    )  # fmt: skip
    assert proc.stderr is not None
    output = bytearray()
    listening = trio.Event()
    out_of_descriptors = trio.Event()

    async def read_log() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.receive_some():
            output.extend(chunk)
            if b"Listening on" in output:
                listening.set()
            if b"Too many open files" in output:
                out_of_descriptors.set()

    answers: list[bytes] = []

    async def stalled_client(address: tuple[str, int], request: bytes) -> None:
        stream = None
        with trio.move_on_after(8):  # one the kernel's accept queue had no room for
            stream = await trio.open_tcp_stream(*address)
        if stream is None:
            return
        async with stream:
            try:
                await stream.send_all(request)
                answers.append(await read_to_close(stream))
            except trio.BrokenResourceError:
                answers.append(b"")

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_log)
            with trio.fail_after(60):
                await listening.wait()
            match = re.search(rb"Listening on http://([\d.]+):(\d+)", output)
            assert match is not None
            address = (match.group(1).decode(), int(match.group(2)))
            host = b"%s:%d" % (address[0].encode(), address[1])
            start_size = len(output)
            stalled = b"POST /api/show HTTP/1.1\r\nHost: %s\r\nContent-Length: 100\r\n\r\n{" % host
            with trio.fail_after(60):
                async with trio.open_nursery() as clients:
                    for _ in range(STALLED):
                        clients.start_soon(stalled_client, address, stalled)
                    await out_of_descriptors.wait()
                    # Every descriptor is taken by a stalled body: a new client is answered
                    # once their body timeout has passed.
                    started = trio.current_time()
                    with trio.fail_after(SERVE_BODY_TIMEOUT + 5):  # the body timeout, and then some
                        probe = await trio.open_tcp_stream(*address)
                        async with probe:
                            await probe.send_all(
                                b"GET /api/version HTTP/1.1\r\nHost: %s\r\n"
                                b"Connection: close\r\n\r\n" % host
                            )
                            answer = await read_to_close(probe)
                    answered = trio.current_time() - started
            text = output.decode()
            assert answer.startswith(b"HTTP/1.1 200 "), answer
            assert answered < SERVE_BODY_TIMEOUT + 5, answered
            assert len(output) - start_size < 200_000
            assert "Traceback" not in text, text[-3000:]
            assert "cannot accept client connections: Too many open files" in text
            timed_out = sum(a.startswith(b"HTTP/1.1 408 ") for a in answers)
            assert timed_out > SOFT_LIMIT // 2, Counter(a[:12] for a in answers)
            proc.terminate()
            assert await proc.wait() == 0, text[-3000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
        await proc.stderr.aclose()
