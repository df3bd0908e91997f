"""Simulated engines that record what reaches them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngineFactory
from ollamatrio.types import CompletionRequest, LoadSpec


class RecordingEngines(SimulatedEngineFactory):
    """Simulated engines that also record every CompletionRequest they get."""

    def __init__(self) -> None:
        super().__init__(default=SimulatedBehaviour(load_seconds=0.01, tokens_per_second=2000))
        self.requests: list[CompletionRequest] = []

    @asynccontextmanager
    async def open(self, spec: LoadSpec, **_: Any) -> AsyncIterator[Any]:
        async with super().open(spec) as engine:
            complete = engine.complete

            def recording(request: CompletionRequest) -> Any:
                self.requests.append(request)
                return complete(request)

            engine.complete = recording  # type: ignore[method-assign]
            yield engine
