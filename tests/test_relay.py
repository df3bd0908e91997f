"""The relay through a real server: one write per engine wake-up, a lone token written at
once, and the generation owned by the request (a client that leaves returns the lease)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

from ollamatrio.engines.simulated import SimulatedEngineFactory
from ollamatrio.types import Chunk, CompletionRequest, LoadSpec


class BatchedStream:
    """An engine stream whose wake-ups the test scripts: each ``release`` lets one batch out."""

    def __init__(self, batches: list[list[Chunk]]) -> None:
        self._batches = batches
        self.gate_send, self._gate = trio.open_memory_channel[None](0)
        self._pending: list[Chunk] = []

    def __aiter__(self) -> BatchedStream:
        return self

    async def __anext__(self) -> Chunk:
        while not self._pending:
            self._pending = await self.next_batch()
            if not self._pending:
                raise StopAsyncIteration
        return self._pending.pop(0)

    async def next_batch(self) -> list[Chunk]:
        if not self._batches:
            return []
        await self._gate.receive()
        return self._batches.pop(0)


class BatchedEngines(SimulatedEngineFactory):
    """Simulated engines whose generations come from :class:`BatchedStream` scripts."""

    def __init__(self, batches: list[list[Chunk]]) -> None:
        super().__init__()
        self.stream = BatchedStream(batches)
        self.released = trio.Event()

    @asynccontextmanager
    async def open(self, spec: LoadSpec, **_: Any) -> AsyncIterator[Any]:
        async with super().open(spec) as engine:
            stream = self.stream

            @asynccontextmanager
            async def complete(request: CompletionRequest) -> AsyncIterator[BatchedStream]:
                try:
                    yield stream
                finally:
                    self.released.set()

            engine.complete = complete  # type: ignore[method-assign]
            yield engine


async def read_chunk(stream: trio.SocketStream, buffer: bytearray) -> bytes:
    """The next HTTP/1.1 chunk of a chunked response (one server write each)."""
    while b"\r\n" not in buffer:
        buffer += await stream.receive_some(65536)
    line, _, rest = bytes(buffer).partition(b"\r\n")
    size = int(line, 16)
    while len(rest) < size + 2:
        rest += await stream.receive_some(65536)
    buffer[:] = rest[size + 2 :]
    return rest[:size]


async def send_generate(url: str, body: dict[str, Any]) -> trio.SocketStream:
    parts = urlsplit(url)
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    data = json.dumps(body).encode()
    await stream.send_all(
        b"POST /api/generate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (parts.netloc.encode(), len(data), data)
    )
    return stream


async def read_head(stream: trio.SocketStream) -> bytearray:
    """Read the response head (sent with the first batch); returns what followed it."""
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer:
        buffer += await stream.receive_some(65536)
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding: chunked" in head.lower()
    return bytearray(rest)


async def preload(url: str) -> None:
    async with httpx.AsyncClient(base_url=url) as c:
        (await c.post("/api/generate", json={"model": "tiny"})).raise_for_status()


async def test_a_burst_is_one_write_and_a_lone_token_is_not_held(api_server) -> None:
    engines = BatchedEngines(
        [
            [Chunk(content="a"), Chunk(content="b"), Chunk(content="c")],
            [Chunk(content="d")],
            [Chunk(done=True, done_reason="stop", eval_count=4)],
        ]
    )
    with trio.fail_after(30):
        async with api_server(engines=engines) as srv:
            await preload(srv.url)  # a stream that waits for a load writes progress first
            stream = await send_generate(srv.url, {"model": "tiny", "prompt": "hi"})
            async with stream:
                await engines.stream.gate_send.send(None)
                buffer = await read_head(stream)
                burst = await read_chunk(stream, buffer)
                assert [json.loads(x)["response"] for x in burst.splitlines()] == ["a", "b", "c"]
                await engines.stream.gate_send.send(None)
                # Nothing more comes from the engine until the test says so: the lone
                # token must have been written on its own.
                lone = await read_chunk(stream, buffer)
                assert [json.loads(x)["response"] for x in lone.splitlines()] == ["d"]
                await engines.stream.gate_send.send(None)
                final = json.loads(await read_chunk(stream, buffer))
                assert final["done"] is True
                assert final["eval_count"] == 4
                assert await read_chunk(stream, buffer) == b""  # the end of the response
            await engines.released.wait()
            while srv.scheduler.ps()[0].refs:  # noqa: ASYNC110 - released right after
                await trio.sleep(0.01)


async def test_a_client_that_leaves_mid_stream_returns_the_lease(api_server) -> None:
    engines = BatchedEngines([[Chunk(content="a")], [Chunk(content="never sent")]])
    with trio.fail_after(30):
        async with api_server(engines=engines) as srv:
            await preload(srv.url)  # a stream that waits for a load writes progress first
            stream = await send_generate(srv.url, {"model": "tiny", "prompt": "hi"})
            await engines.stream.gate_send.send(None)
            buffer = await read_head(stream)
            assert json.loads(await read_chunk(stream, buffer))["response"] == "a"
            assert srv.scheduler.ps()[0].refs == 1
            await stream.aclose()
            await engines.released.wait()  # the engine stream was closed...
            while srv.scheduler.ps()[0].refs:  # noqa: ASYNC110 - ...and the lease follows
                await trio.sleep(0.01)
