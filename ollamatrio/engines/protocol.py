"""What a loaded model offers the rest of the server.

An *engine factory* opens one loaded model (an :class:`Engine`) for a :class:`LoadSpec`.
``factory.open(spec, progress=...)`` is an async context manager: entering it returns once
the model is loaded and healthy, telling the optional ``progress`` callback how far the load
has come on the way (or raises :class:`~ollamatrio.errors.RunnerStartError`), leaving it
unloads the model and frees everything.  If the model dies while the context is open
(the runner process crashed), the body of the ``async with`` is cancelled and
:class:`~ollamatrio.errors.RunnerCrashedError` comes out of it, so the scheduler's runner
task learns about crashes structurally, with no polling.

A generation comes as :class:`ChunkBatches`: chunks one by one, or every chunk of one
wake-up of the engine at once (what the relay writes to its client in one go).  Beyond
loaded models, a factory may keep something ready for the next load (the process engine's
spare runner): :meth:`EngineFactory.keep_spare`, which the server runs beside its listener.

Two implementations exist: :mod:`ollamatrio.engines.process` (a runner subprocess hosting
llama.cpp) and :mod:`ollamatrio.engines.simulated` (for tests, demos and benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import trio

from ..types import Chunk, CompletionRequest, Embeddings, LoadSpec, MemoryUsage, Ranking


class ChunkBatches(Protocol):
    """One generation's chunks: iterated one by one, or taken by wake-up."""

    def __aiter__(self) -> ChunkBatches: ...

    async def __anext__(self) -> Chunk: ...

    async def next_batch(self) -> list[Chunk]:
        """Every chunk of the engine's next wake-up (at least one); ``[]`` once the
        generation has ended."""
        ...


class Engine(Protocol):
    """A loaded model.  Valid only inside its factory's ``open`` context."""

    @property
    def spec(self) -> LoadSpec: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def context_length(self) -> int:
        """Per-slot context the engine really allocated."""
        ...

    @property
    def memory(self) -> MemoryUsage:
        """Measured memory after load."""
        ...

    def prompt_cache_held(self) -> int:
        """Bytes its host prompt cache holds now (0 without one).  Cheap: the scheduler
        reads it on every placement pass, to book it beside the model."""
        ...

    def grant_prompt_cache(self, nbytes: int) -> None:
        """Let its host prompt cache hold at most ``nbytes`` (never more than its limit)
        from now on: a state that would pass it is not saved, and a grant below what the
        cache holds makes it drop states at its next save."""
        ...

    @property
    def load_phases(self) -> Mapping[str, float]:
        """Seconds per phase of the load, in order (the process engine's ``LOAD_PHASES``);
        empty from an engine that does not measure them."""
        ...

    @property
    def thread_pool(self) -> int:
        """The CPU threads it was loaded with, when :meth:`use_threads` can lower its count
        while it runs; 0 when its count is fixed."""
        ...

    @property
    def threads(self) -> int:
        """The CPU threads it may use now (0: unknown)."""
        ...

    async def use_threads(self, threads: int) -> None:
        """Use at most ``threads`` CPU threads from its next computation on (between 1 and
        :attr:`thread_pool`; scheduler/core_share.py).  A model whose count is fixed, or
        whose process has gone, ignores it."""
        ...

    def complete(self, request: CompletionRequest) -> AbstractAsyncContextManager[ChunkBatches]:
        """Stream a generation.  Leaving the context early stops it and frees the slot."""
        ...

    async def embed(
        self, inputs: Sequence[str], *, truncate: bool = True, dimensions: int | None = None
    ) -> Embeddings: ...

    async def rerank(self, query: str, documents: Sequence[str]) -> Ranking:
        """Score each document against ``query`` (a model loaded with rank pooling)."""
        ...

    async def tokenize(self, text: str) -> list[int]: ...

    async def count_tokens(self, request: CompletionRequest) -> int:
        """The tokens of ``request``'s prompt as a generation would give it to the model
        (messages rendered with the model's template), before any truncation."""
        ...

    async def detokenize(self, tokens: Sequence[int]) -> str: ...

    async def healthy(self) -> bool: ...

    async def metrics(self) -> str:
        """The engine's own counters in Prometheus text format (llama.cpp's ``/metrics``)."""
        ...


# Told ``(completed, total)`` in bytes of model data as a load advances (synchronously, from
# the opener's task; it must be cheap).  Engines report what they can see: at least the
# start (0) and, once loaded, ``total``.
LoadProgress = Callable[[int, int], None]


class EngineFactory(Protocol):
    def open(
        self, spec: LoadSpec, *, progress: LoadProgress | None = None
    ) -> AbstractAsyncContextManager[Engine]: ...

    async def keep_spare(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep a spare ready for the next cold load until cancelled; a factory that keeps
        none reports started and returns."""
        ...
