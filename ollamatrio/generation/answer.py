"""A whole generation in one piece: what ``"stream": false`` answers, before any dialect
renders it.

:class:`Fold` collects the chunks of a :class:`~.relay.Generation` batch by batch and makes
one frozen :class:`Answer` at the end; each dialect turns that into its own object (native
``/api/generate`` and ``/api/chat`` objects, OpenAI's ``text_completion`` and
``chat.completion``).  Streams never fold: their encoders write the chunks as they come.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..types import Chunk, ToolCall
from .relay import Generation, Timings


@dataclass(frozen=True)
class Answer:
    """A finished generation: its text, the calls it asked for, and how it ended."""

    content: str
    thinking: str
    tool_calls: tuple[ToolCall, ...]
    # Ollama's per-token log-probabilities ({token, logprob, bytes, top_logprobs?}), as the
    # engine reported them; empty unless the request asked.
    logprobs: tuple[Mapping[str, Any], ...]
    done_reason: str  # "stop" or "length"
    stop_sequence: str  # the stop sequence that ended it ("" when none did)
    context: tuple[int, ...]  # prompt and answer as token ids, when the request asked
    timings: Timings


class Fold:
    """The chunks of a generation, gathered for one :class:`Answer`."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._thinking: list[str] = []
        self._tool_calls: list[ToolCall] = []
        self._logprobs: list[Mapping[str, Any]] = []

    def add(self, batch: list[Chunk]) -> None:
        for chunk in batch:
            self._content.append(chunk.content)
            self._thinking.append(chunk.thinking)
            self._tool_calls.extend(chunk.tool_calls)
            self._logprobs.extend(chunk.logprobs)

    def answer(self, gen: Generation) -> Answer:
        """The answer, once ``gen`` is over (its durations are measured now)."""
        final = gen.final or Chunk(done=True, done_reason="stop")
        return Answer(
            content="".join(self._content),
            thinking="".join(self._thinking),
            tool_calls=tuple(self._tool_calls),
            logprobs=tuple(self._logprobs),
            done_reason=final.done_reason or "stop",
            stop_sequence=final.stop_sequence,
            context=tuple(final.context),
            timings=gen.timings(final),
        )
