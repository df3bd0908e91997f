"""The token relay: one generation's lease and engine stream, and the encoder protocol that
every dialect's wire format implements.

Typed chunks come in, a batch per engine wake-up (everything the runner sent since the last
read); each encoder turns a whole batch into one piece of bytes, so a relay writes to its
client once per wake-up and a token that arrives alone is written at once.  The same
:class:`Generation` feeds every format: native NDJSON (``/api/generate``, ``/api/chat``),
OpenAI server-sent events (``/v1/completions``, ``/v1/chat/completions``) and the folded
single object of ``"stream": false`` (:mod:`.answer`).  Errors stay exceptions until an
encoder writes them.  The encoders live with their dialects: :mod:`ollamatrio.api.native.stream`
and :mod:`ollamatrio.api.openai.stream`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from ..engines.protocol import ChunkBatches
from ..scheduler import Lease, ModelRequest, Scheduler
from ..types import Chunk, CompletionRequest
from ..wire import ns


@dataclass(frozen=True)
class Timings:
    """A generation's counts and durations (nanoseconds), as Ollama reports them."""

    total_duration: int
    load_duration: int
    prompt_eval_count: int
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int
    prompt_cached_count: int = 0  # of prompt_eval_count, the tokens reused (not evaluated)
    draft_count: int | None = None  # speculative decoding: drafted; None: no drafter
    draft_accepted_count: int | None = None  # of draft_count, the tokens the model kept


class Generation:
    """A generation in progress: valid inside :func:`open_generation`'s block, which owns
    the lease and the engine stream and closes both when the request ends (also by
    cancellation: a client that leaves, or shutdown)."""

    def __init__(self, lease: Lease, stream: ChunkBatches, started: float) -> None:
        self.lease = lease
        self._stream = stream
        self.started = started
        self.final: Chunk | None = None  # the done chunk, once seen
        self.first_content_at: float | None = None  # trio time of the first content (TTFT)

    @property
    def load_duration(self) -> float:
        return self.lease.load_duration

    async def next_batch(self) -> list[Chunk]:
        """The chunks of the engine's next wake-up; ``[]`` after the done chunk.  A stream
        that ends without one gets a plain ``stop`` (as Ollama reports it)."""
        if self.final is not None:
            return []
        batch = await self._stream.next_batch()
        if not batch:
            batch = [Chunk(done=True, done_reason="stop")]
        if self.first_content_at is None and any(_content(c) for c in batch):
            self.first_content_at = trio.current_time()
        for i, chunk in enumerate(batch):
            if chunk.done:
                self.final = chunk
                return batch[: i + 1]
        return batch

    def timings(self, chunk: Chunk) -> Timings:
        """The counts of the final ``chunk``, and the durations until now."""
        return Timings(
            total_duration=ns(trio.current_time() - self.started),
            load_duration=ns(self.load_duration),
            prompt_eval_count=chunk.prompt_eval_count,
            prompt_eval_duration=chunk.prompt_eval_duration,
            eval_count=chunk.eval_count,
            eval_duration=chunk.eval_duration,
            prompt_cached_count=chunk.prompt_cached_count,
            draft_count=chunk.draft_count,
            draft_accepted_count=chunk.draft_accepted_count,
        )


def _content(chunk: Chunk) -> bool:
    return bool(chunk.content or chunk.thinking or chunk.tool_calls)


@asynccontextmanager
async def open_generation(
    scheduler: Scheduler, request: ModelRequest, completion: CompletionRequest, started: float
) -> AsyncIterator[Generation]:
    async with (
        scheduler.lease(request) as lease,
        lease.engine.complete(completion) as stream,
        _closing(stream),
    ):
        yield Generation(lease, stream, started)


def _closing(stream: Any) -> AbstractAsyncContextManager[Any]:
    """Close an engine's chunk generator that stopped early (after the done chunk)."""
    return aclosing(stream) if hasattr(stream, "aclose") else nullcontext()


class Encoder(Protocol):
    content_type: str

    def encode(self, batch: list[Chunk], gen: Generation) -> bytes: ...

    def error(self, message: str, status: int) -> bytes: ...

    def end(self) -> bytes: ...
