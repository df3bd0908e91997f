"""The raw runner HTTP client: chunked decoding, SSE batches, keep-alive reuse and retries,
against a scripted server on a real Unix socket."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from ollamatrio.engines.runner_http import (
    EventStream,
    RunnerConnectionError,
    RunnerHttp,
    RunnerStatusError,
    parse_event,
)
from ollamatrio.http1.framing import ChunkedDecoder

Handler = Callable[[trio.SocketStream, bytes], Awaitable[bool]]  # -> keep the connection?


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def sse(*events: dict) -> list[bytes]:
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"Keep-Alive: timeout=5, max=100\r\n\r\n"
)


def plain(status: int, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Keep-Alive: timeout=5, max=100\r\n\r\n%s" % (status, len(body), body)
    )


async def read_request(stream: trio.SocketStream, buffer: bytearray) -> bytes | None:
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
    end = buffer.index(b"\r\n\r\n") + 4
    head = bytes(buffer[:end])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(buffer) < end + length:
        buffer += await stream.receive_some(65536)
    request = bytes(buffer[: end + length])
    del buffer[: end + length]
    return request


@asynccontextmanager
async def scripted_server(tmp_path: Path, handler: Handler) -> AsyncIterator[dict]:
    """A Unix-socket server calling ``handler`` for each request; stats in the dict."""
    path = str(tmp_path / "llama.sock")
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(16)
    listener = trio.SocketListener(sock)
    stats: dict = {"path": path, "connections": 0, "requests": [], "eof": trio.Event()}

    async def serve_one(stream: trio.SocketStream) -> None:
        stats["connections"] += 1
        buffer = bytearray()
        async with stream:
            try:
                while True:
                    request = await read_request(stream, buffer)
                    if request is None:
                        stats["eof"].set()
                        return
                    stats["requests"].append(request)
                    if not await handler(stream, request):
                        return
            except trio.BrokenResourceError:
                stats["eof"].set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve_one, [listener])
        yield stats
        nursery.cancel_scope.cancel()


def test_events_are_the_same_however_the_stream_is_chunked_and_read() -> None:
    """The fast path (one read = one chunk = one event, as llama.cpp streams) and the general
    one decode the same events from any chunking and any reads."""
    events = [{"content": c, "stop": False} for c in ("a", " the", "\n\nx", "é")]
    body = b"".join(sse(*events)) + b'error: {"message": "x"}\n\ndata: [DONE]\n\n'
    expected = [*events, {"error": {"message": "x"}}]
    rng = random.Random(11)
    for _ in range(500):
        cuts = sorted(rng.sample(range(1, len(body)), rng.randint(0, 6)))
        wire = chunked(*(body[i:j] for i, j in zip([0, *cuts], [*cuts, len(body)], strict=True)))
        reads = sorted(rng.sample(range(1, len(wire)), rng.randint(0, 8)))
        stream = EventStream(None)  # type: ignore[arg-type]  # its decoding alone
        decoder = ChunkedDecoder()
        buffer = bytearray()
        out = []
        for i, j in zip([0, *reads], [*reads, len(wire)], strict=True):
            buffer += wire[i:j]
            out += stream._decode(decoder.take(buffer))
        assert out == expected
        assert decoder.done
    stream = EventStream(None)  # type: ignore[arg-type]
    assert [stream._decode(piece) for piece in sse(*events)] == [[e] for e in events]


async def test_bad_chunk_framing_is_a_connection_error(tmp_path) -> None:
    async def handler(stream: trio.SocketStream, request: bytes) -> bool:
        await stream.send_all(STREAM_HEAD + b"zz\r\nabc")
        return False

    async with scripted_server(tmp_path, handler) as stats:
        client = RunnerHttp(stats["path"], "k")
        async with client.stream("/completion", b"{}") as (_, events):
            with pytest.raises(RunnerConnectionError, match="bad chunk size"):
                await events.next_batch()


def test_parse_event_forms() -> None:
    assert parse_event(b'data: {"a": 1}') == {"a": 1}
    assert parse_event(b"data: [DONE]") is None
    assert parse_event(b": comment") is None
    assert parse_event(b'error: {"message": "bad"}') == {"error": {"message": "bad"}}
    assert parse_event(b'error: {"error": {"code": 400}}') == {"error": {"code": 400}}


async def test_a_burst_arrives_as_one_batch_and_a_lone_event_is_not_held(tmp_path) -> None:
    release = trio.Event()
    finish = trio.Event()

    async def handler(stream: trio.SocketStream, request: bytes) -> bool:
        burst = sse({"n": 1}, {"n": 2}, {"n": 3})
        await stream.send_all(STREAM_HEAD + b"".join(chunked(e)[:-5] for e in burst))
        await release.wait()
        await stream.send_all(chunked(*sse({"n": 4}))[:-5])
        await finish.wait()  # the lone event must be delivered while nothing else comes
        await stream.send_all(b"0\r\n\r\n")
        return False  # llama.cpp closes after a stream

    async with scripted_server(tmp_path, handler) as stats:
        client = RunnerHttp(stats["path"], "k")
        async with client.stream("/completion", b"{}") as (response, events):
            assert response.status == 200
            assert await events.next_batch() == [{"n": 1}, {"n": 2}, {"n": 3}]
            release.set()
            with trio.fail_after(5):
                assert await events.next_batch() == [{"n": 4}]
            assert not events.ended
            finish.set()
            assert await events.next_batch() == []
            assert events.ended
    assert b"Authorization: Bearer k\r\n" in stats["requests"][0]


async def test_plain_requests_reuse_one_connection(tmp_path) -> None:
    async def handler(stream: trio.SocketStream, request: bytes) -> bool:
        await stream.send_all(plain(200, b'{"status":"ok"}'))
        return True

    async with scripted_server(tmp_path, handler) as stats:
        client = RunnerHttp(stats["path"], "k")
        for _ in range(5):
            assert await client.request("GET", "/health") == (200, b'{"status":"ok"}')
        assert client.connections_opened == 1
        assert stats["connections"] == 1
        client.close()


async def test_a_stream_reuses_an_idle_connection_and_cancelling_it_closes_it(
    tmp_path,
) -> None:
    async def handler(stream: trio.SocketStream, request: bytes) -> bool:
        if request.startswith(b"GET"):
            await stream.send_all(plain(200, b"{}"))
            return True
        await stream.send_all(STREAM_HEAD)
        for n in range(1000):
            await stream.send_all(chunked(*sse({"n": n}))[:-5])
            await trio.sleep(0.01)
        return False

    async with scripted_server(tmp_path, handler) as stats:
        client = RunnerHttp(stats["path"], "k")
        await client.request("GET", "/health")
        with trio.move_on_after(0.1):
            async with client.stream("/completion", b"{}") as (_, events):
                while True:
                    await events.next_batch()
        assert client.connections_opened == 1  # the stream went over the pooled one
        with trio.fail_after(1):
            await stats["eof"].wait()  # the runner saw the client leave


async def test_a_pooled_connection_closed_by_the_server_is_retried_once(tmp_path) -> None:
    async def handler(stream: trio.SocketStream, request: bytes) -> bool:
        await stream.send_all(plain(200, b"{}"))
        return False  # close after answering, without saying so

    async with scripted_server(tmp_path, handler) as stats:
        client = RunnerHttp(stats["path"], "k")
        for _ in range(3):
            assert await client.request("POST", "/tokenize", b"{}") == (200, b"{}")
        assert client.connections_opened == 3
        assert len(stats["requests"]) == 3
        client.close()


async def test_an_error_status_on_a_stream_carries_the_body(tmp_path) -> None:
    async def handler(stream: trio.SocketStream, request: bytes) -> bool:
        await stream.send_all(plain(400, b'{"error":{"code":400,"message":"too long"}}'))
        return True

    async with scripted_server(tmp_path, handler) as stats:
        client = RunnerHttp(stats["path"], "k")
        with pytest.raises(RunnerStatusError) as caught:
            async with client.stream("/completion", b"{}"):
                pass
        assert caught.value.status == 400
        assert json.loads(caught.value.body)["error"]["message"] == "too long"


async def test_a_runner_that_dies_mid_stream_is_a_connection_error(tmp_path) -> None:
    async def handler(stream: trio.SocketStream, request: bytes) -> bool:
        await stream.send_all(STREAM_HEAD + chunked(*sse({"n": 1}))[:-5])
        return False  # gone without the final chunk

    async with scripted_server(tmp_path, handler) as stats:
        client = RunnerHttp(stats["path"], "k")
        async with client.stream("/completion", b"{}") as (_, events):
            assert await events.next_batch() == [{"n": 1}]
            with pytest.raises(RunnerConnectionError, match="closed the connection"):
                await events.next_batch()
