"""The HTTP/1.1 client over TCP, as the gateway uses it (``fleet/gateway_upstream.py``):
bodies framed every way, the pool, and every failure below HTTP as one error naming the
peer.  The runner's side (a Unix socket) is ``tests/test_runner_http.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from ollamatrio.errors import PeerConnectionError, TransportError
from ollamatrio.fleet.gateway_upstream import HostConnectionError, HostPool

# A request head -> the answer, and whether the connection closes after it.
Answer = Callable[[bytes], Awaitable[tuple[bytes, bool]]]


@asynccontextmanager
async def host(answer: Answer) -> AsyncIterator[tuple[str, int]]:
    """A TCP server answering each request head as ``answer`` says; its address."""

    async def serve(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        async with stream:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                end = buffer.index(b"\r\n\r\n") + 4
                request, buffer[:] = bytes(buffer[:end]), buffer[end:]
                reply, close = await answer(request)
                await stream.send_all(reply)
                if close:
                    return

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        yield "127.0.0.1", listeners[0].socket.getsockname()[1]
        nursery.cancel_scope.cancel()


def test_the_gateways_error_is_the_projects_transport_error() -> None:
    assert HostConnectionError is PeerConnectionError
    assert issubclass(HostConnectionError, TransportError)


async def test_bodies_framed_every_way_and_the_connection_kept_when_it_may_be() -> None:
    answers = {
        b"/length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        b"/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2;x=1\r\nhe\r\n3\r\nllo\r\n0\r\nX-Trailer: 1\r\n\r\n",
        b"/empty": b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
    }

    async def answer(request: bytes) -> tuple[bytes, bool]:
        return answers[request.split(b" ")[1]], False

    async with host(answer) as address:
        pool = HostPool(address)
        for path in ("/length", "/chunked", "/empty", "/chunked", "/length"):
            status, body = await pool.get(path)
            assert (status, body) == ((204, b"") if path == "/empty" else (200, b"hello"))
        assert pool.connections_opened == 1
        pool.close()


async def test_a_body_that_ends_with_the_connection() -> None:
    async def answer(request: bytes) -> tuple[bytes, bool]:
        return b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it", True

    async with host(answer) as address:
        pool = HostPool(address)
        for _ in range(2):
            with trio.fail_after(5):
                assert await pool.get("/") == (200, b"all of it")
        assert pool.connections_opened == 2  # not kept: the body ended with the connection


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"HTTX\r\n\r\n", "bad status line b'HTTX' from the host"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "closed the connection mid"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX",
            "malformed chunk: no CRLF after its data from the host",
        ),
        (b"HTTP/1.1 200 OK\r\nX: " + b"x" * 70000, "the host sent an oversized response head"),
    ],
)
async def test_what_is_not_http_is_a_connection_error(reply: bytes, message: str) -> None:
    async def answer(request: bytes) -> tuple[bytes, bool]:
        return reply, True

    async with host(answer) as address:
        pool = HostPool(address)
        with trio.fail_after(5), pytest.raises(HostConnectionError, match=message):
            await pool.get("/")


async def test_a_host_that_is_not_there() -> None:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nobody listens on it now
    with pytest.raises(HostConnectionError, match=f"cannot connect to 127.0.0.1:{port}"):
        await HostPool(("127.0.0.1", port)).get("/")
