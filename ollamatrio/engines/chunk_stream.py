"""One generation's stream of chunks, pulled from a runner's server-sent events.

:class:`ChunkStream` turns the events of one ``/completion`` or chat completion into
:class:`~ollamatrio.types.Chunk` batches (one wake-up of the runner, one batch), with
Ollama's guard against a model stuck repeating itself (B61).  :func:`stall_guard` is the
generation's stall deadline: the stream's reads arm and disarm it, and when a read waits
``stall_timeout`` seconds for a byte the client's stall error ends the block.
:class:`GenerationContext` computes ``/api/generate``'s ``context`` once the answer is done.

The stream needs only a few things of the client that opened it (its stall timeout and
errors, its template rendering and tokenizer): :class:`StreamClient` names them, so this
module sits below ``runner_client.py`` and never imports it.

Bn codes in this module name Ollama's behaviours, each defined in docs/behaviours.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Protocol

import trio

from ollamatrio.engines.llamacpp_wire import ChatStream, CompletionStream
from ollamatrio.engines.runner_http import EventSource
from ollamatrio.errors import RunnerError, TransportError
from ollamatrio.types import Chunk, CompletionRequest

log = logging.getLogger(__name__)

REPEAT_LIMIT = 30  # identical pieces in a row before a generation counts as stuck (B61)


class StreamClient(Protocol):
    """What a stream asks of the client whose runner it reads (``RunnerClient``)."""

    stall_timeout: float  # seconds a generation may go without a byte

    async def stalled(self) -> RunnerError: ...

    async def runner_gone(self, exc: BaseException | None) -> RunnerError: ...

    async def server_error(self, exc: TransportError) -> Exception:
        """The server's error for a lost connection or an error the runner reported."""
        ...

    async def render(self, request: CompletionRequest) -> str: ...

    async def tokenize_prompt(self, text: str) -> list[int]: ...


@asynccontextmanager
async def stall_guard(engine: StreamClient) -> AsyncIterator[trio.CancelScope]:
    """The stall deadline of one generation: a scope around the whole stream that its reads
    arm (``ChunkStream._read``) and disarm, cheaper per token than a scope per read.  When
    it fires, the block ends with the engine's stall error."""
    with trio.CancelScope() as scope:
        yield scope
    if scope.cancelled_caught:
        raise await engine.stalled()


class GenerationContext:
    """/api/generate's ``context`` for one generation: the prompt and the answer as token
    ids, computed once the answer is complete (Ollama tokenizes prompt + answer text)."""

    def __init__(self, engine: StreamClient, request: CompletionRequest) -> None:
        self._engine = engine
        self._request = request
        self._answer: list[str] = []

    async def annotate(self, batch: list[Chunk]) -> list[Chunk]:
        out = []
        for chunk in batch:
            self._answer.append(chunk.content)
            if chunk.done:
                request = self._request
                prompt = request.prompt
                if prompt is None:
                    prompt = await self._engine.render(request)
                tokens = await self._engine.tokenize_prompt(prompt + "".join(self._answer))
                chunk = replace(chunk, context=tuple(tokens))
            out.append(chunk)
        return out


class ChunkStream:
    """Pull-based stream of one generation's chunks (no task of its own).

    :meth:`next_batch` returns every chunk the runner's last wake-up delivered, so a relay
    can write them to its client at once; iterating gives them one by one."""

    def __init__(
        self,
        engine: StreamClient,
        events: EventSource,
        parser: ChatStream | CompletionStream,
        context: GenerationContext | None,
        stall: trio.CancelScope,
    ) -> None:
        """``stall``: the scope of :func:`stall_guard` around the stream's use."""
        self._engine = engine
        self._events = events
        self._stall = stall
        self._parser = parser
        self._context = context
        self._pending: list[Chunk] = []
        self._finished = False
        self._last_piece = ""
        self._repeats = 0
        self._pieces = 0

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> Chunk:
        while not self._pending:
            if self._finished:
                raise StopAsyncIteration
            self._pending = await self.next_batch()
        return self._pending.pop(0)

    async def next_batch(self) -> list[Chunk]:
        """The chunks of the next wake-up; ``[]`` once the generation has ended."""
        if self._pending:
            batch, self._pending = self._pending, []
            return batch
        while not self._finished:
            batch = self._guard(await self._read())
            if batch:
                return batch if self._context is None else await self._context.annotate(batch)
        return []

    def _guard(self, chunks: list[Chunk]) -> list[Chunk]:
        """Ollama's guard (B61): a model emitting the same piece over and over is stuck;
        end the answer at the piece past the limit (closing the stream stops llama.cpp)."""
        for i, chunk in enumerate(chunks):
            if chunk.content and not chunk.done and self._stuck(chunk.content):
                log.debug("prediction aborted: %r repeated %d times", chunk.content, self._repeats)
                self._finished = True
                return [*chunks[:i], Chunk(done=True, done_reason="stop", eval_count=self._pieces)]
        return chunks

    def _stuck(self, piece: str) -> bool:
        self._pieces += 1
        if piece == self._last_piece:
            self._repeats += 1
        else:
            self._last_piece, self._repeats = piece, 0
        return self._repeats > REPEAT_LIMIT

    async def _read(self) -> list[Chunk]:
        timeout = self._engine.stall_timeout
        stall = self._stall if timeout != math.inf else None
        if stall is not None:
            stall.deadline = trio.current_time() + timeout
        chunks: list[Chunk] = []
        try:
            events = await self._events.next_batch()
            for event in events:
                chunks.extend(self._parser.feed(event))
        except TransportError as exc:  # the connection failed, or the runner reported one
            self._finished = True
            raise await self._engine.server_error(exc) from exc
        finally:
            if stall is not None:
                stall.deadline = math.inf  # the time spent elsewhere is not a stall
        if self._parser.done:  # its final event (or, in a chat, a stop sequence) came
            self._finished = True
        elif not events:  # the response ended
            chunks.extend(self._parser.finish())
            self._finished = True
            if not self._parser.done:  # it stopped without its final event
                raise await self._engine.runner_gone(None)
        return chunks
