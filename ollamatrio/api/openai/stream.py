"""The OpenAI dialect's wire encoders: ``/v1/chat/completions`` and ``/v1/completions``
server-sent events, one piece of bytes per engine wake-up."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ...generation.relay import Generation
from ...types import Chunk
from ...wire import SSE, SSE_DONE, json_bytes
from . import wire as oai

# -- OpenAI server-sent events -----------------------------------------------------------


def _sse(obj: Any) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


def _usage(chunk: Chunk) -> dict[str, Any]:
    return oai.usage_counts(
        chunk.prompt_eval_count, chunk.eval_count, chunk.prompt_cached_count,
        chunk.draft_count, chunk.draft_accepted_count,
    )  # fmt: skip


class _Events:
    """One streamed OpenAI response: its id and creation time stay fixed."""

    content_type = SSE
    object = ""
    prefix = ""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.id = oai.new_id(self.prefix)
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        # The event of a chunk that carries only text is spliced from bytes (_text_event).
        self._opening = b"data: " + json_bytes(self.envelope([]))[: -len(b"]}")]

    def _text_event(self, choice_opening: bytes, text: str, choice_closing: bytes) -> bytes:
        return self._opening + choice_opening + orjson.dumps(text) + choice_closing + b"]}\n\n"

    def envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": oai.SYSTEM_FINGERPRINT,
            "choices": choices,
        }

    def _closing(self, chunk: Chunk, choice: dict[str, Any]) -> bytes:
        out = _sse(self.envelope([choice]))
        if self.include_usage:
            usage = self.envelope([])
            usage["usage"] = _usage(chunk)
            out += _sse(usage)
        return out

    def error(self, message: str, status: int) -> bytes:
        return _sse(oai.error_object(message, status))

    def end(self) -> bytes:
        return SSE_DONE


class ChatEvents(_Events):
    """``chat.completion.chunk`` events.  The finish reason comes in its own chunk with an
    empty delta, then the usage chunk if asked for."""

    object = "chat.completion.chunk"
    prefix = "chatcmpl"

    def __init__(self, model: str, include_usage: bool) -> None:
        super().__init__(model, include_usage)
        self._tool_calls = 0

    def encode(self, batch: list[Chunk], gen: Generation) -> bytes:
        out = bytearray()
        for chunk in batch:
            if chunk.content and not (chunk.thinking or chunk.tool_calls or chunk.logprobs):
                out += self._text_event(
                    b'{"index":0,"delta":{"role":"assistant","content":', chunk.content,
                    b'},"finish_reason":null}',
                )  # fmt: skip
            elif chunk.content or chunk.thinking or chunk.tool_calls or chunk.logprobs:
                delta: dict[str, Any] = {"role": "assistant", "content": chunk.content}
                if chunk.thinking:
                    delta["reasoning"] = chunk.thinking
                if chunk.tool_calls:
                    calls = oai.openai_tool_calls(chunk.tool_calls, self._tool_calls, stream=True)
                    delta["tool_calls"] = calls
                    self._tool_calls += len(calls)
                choice = {"index": 0, "delta": delta, "finish_reason": None}
                if chunk.logprobs:
                    choice["logprobs"] = {"content": list(chunk.logprobs)}
                out += _sse(self.envelope([choice]))
            if chunk.done:
                reason = "tool_calls" if self._tool_calls else chunk.done_reason or "stop"
                empty = {"role": "assistant", "content": ""}
                out += self._closing(chunk, {"index": 0, "delta": empty, "finish_reason": reason})
        return bytes(out)


class CompletionEvents(_Events):
    """Streamed ``text_completion`` events."""

    object = "text_completion"
    prefix = "cmpl"

    @staticmethod
    def _choice(
        text: str, finish_reason: str | None, logprobs: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        return {
            "text": text, "index": 0, "finish_reason": finish_reason,
            "logprobs": {"content": list(logprobs)} if logprobs else None,
        }  # fmt: skip

    def encode(self, batch: list[Chunk], gen: Generation) -> bytes:
        out = bytearray()
        for chunk in batch:
            if chunk.content and not chunk.logprobs:
                out += self._text_event(
                    b'{"text":', chunk.content, b',"index":0,"finish_reason":null,"logprobs":null}'
                )
            elif chunk.logprobs:
                out += _sse(self.envelope([self._choice(chunk.content, None, chunk.logprobs)]))
            if chunk.done:
                out += self._closing(chunk, self._choice("", chunk.done_reason or "stop"))
        return bytes(out)
