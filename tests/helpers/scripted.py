"""Simulated engines that record every request and answer a tool offer with a scripted tool
call (which the simulated engine itself cannot do): the dialects' tool-call tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from ollamatrio.engines.simulated import ChunkByChunk, SimulatedBehaviour, SimulatedEngineFactory
from ollamatrio.types import Chunk, CompletionRequest, LoadSpec, ToolCall, ToolCallDelta

FAST = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=2000)


def weather_call(name: str, *, content: str = "", call_id: str = "") -> list[Chunk]:
    """Thinking, optional text, then one call of tool ``name`` for Paris's weather."""
    chunks = [Chunk(thinking="the user wants the weather")]
    if content:
        chunks.append(Chunk(content=content))
    chunks.append(Chunk(tool_calls=[ToolCall(name, {"city": "Paris"}, call_id)]))
    chunks.append(Chunk(done=True, done_reason="stop", prompt_eval_count=7, eval_count=5))
    return chunks


def weather_call_written(name: str) -> list[Chunk]:
    """Text, then one call of tool ``name`` as a model writes it (its start, then its
    arguments in pieces, as llama.cpp's chat stream gives them), then the whole call."""
    return [
        Chunk(content="Let me look."),
        Chunk(tool_call_deltas=[ToolCallDelta(0, "call_w", name)]),
        Chunk(tool_call_deltas=[ToolCallDelta(0, arguments='{"city":')]),
        Chunk(tool_call_deltas=[ToolCallDelta(0, arguments='"Paris"}')]),
        Chunk(tool_calls=[ToolCall(name, {"city": "Paris"}, "call_w")]),
        Chunk(done=True, done_reason="stop", prompt_eval_count=7, eval_count=9),
    ]


class ScriptedEngine:
    """A simulated engine that records requests and answers a tool offer with ``answer``."""

    def __init__(
        self, inner: Any, seen: list[CompletionRequest], answer: Callable[[str], list[Chunk]]
    ) -> None:
        self._inner = inner
        self._seen = seen
        self._answer = answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @asynccontextmanager
    async def complete(self, request: CompletionRequest) -> AsyncIterator[AsyncIterator[Chunk]]:
        self._seen.append(request)
        if not request.tools:
            async with self._inner.complete(request) as chunks:
                yield chunks
            return
        yield ChunkByChunk(self._chunks(self._answer(request.tools[0]["function"]["name"])))

    @staticmethod
    async def _chunks(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
        for chunk in chunks:
            yield chunk


class ScriptedEngines:
    """Opens simulated engines wrapped in :class:`ScriptedEngine`; keeps what they saw."""

    def __init__(self, answer: Callable[[str], list[Chunk]] = weather_call) -> None:
        self.inner = SimulatedEngineFactory(None, default=FAST)
        self.requests: list[CompletionRequest] = []
        self._answer = answer

    @asynccontextmanager
    async def open(self, spec: LoadSpec, **_: Any) -> AsyncIterator[ScriptedEngine]:
        async with self.inner.open(spec) as engine:
            yield ScriptedEngine(engine, self.requests, self._answer)

    async def keep_spare(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self.inner.keep_spare(task_status=task_status)
