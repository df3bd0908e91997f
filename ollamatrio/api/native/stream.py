"""The native dialect's wire encoders: ``/api/generate`` and ``/api/chat`` NDJSON lines, one
piece of bytes per engine wake-up, and the progress lines of a stream that waits for its
model to load (:meth:`GenerateLines.load_line`).  The single object of ``"stream": false`` is
rendered from the folded answer (:func:`.wire.generate_answer`,
:func:`.wire.chat_answer`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import orjson

from ...generation.relay import Generation
from ...types import Chunk
from ...wire import NDJSON, json_bytes, rfc3339, rfc3339_now
from .wire import timings

# -- native NDJSON -----------------------------------------------------------------------


class GenerateLines:
    """``/api/generate`` lines."""

    content_type = NDJSON
    # A line that carries only text (most of them) is spliced from bytes, not encoded
    # from a dict: ``{"model":…,"created_at":…,`` + opening + the text + closing.  orjson
    # writes a string exactly as json_bytes does, ten times faster.
    _text_opening = b'"response":'
    _text_closing = b',"done":false}\n'
    # A line's body before anything is generated (the load lines).
    _empty: ClassVar[Mapping[str, Any]] = {"response": ""}

    def __init__(self, model: str) -> None:
        self._model = model
        self._prefix = b'{"model":' + json_bytes(model) + b',"created_at":"'

    def load_line(self, completed: int, total: int) -> bytes:
        """A line while the model loads: shaped like the stream's own (so Ollama's clients
        keep parsing them), with an extra ``load_progress``::

            {"model":"m","created_at":"...","response":"","done":false,
             "load_progress":{"completed":52428800,"total":98362432}}
        """
        return json_bytes({
            "model": self._model,
            "created_at": rfc3339(),
            **self._empty,
            "done": False,
            "load_progress": {"completed": completed, "total": total},
        }) + b"\n"  # fmt: skip

    def _body(self, chunk: Chunk) -> dict[str, Any]:
        obj: dict[str, Any] = {"response": chunk.content}
        if chunk.thinking:
            obj["thinking"] = chunk.thinking
        return obj

    def _line(self, start: bytes, chunk: Chunk, gen: Generation) -> bytes:
        if not (chunk.done or chunk.thinking or chunk.logprobs or chunk.tool_calls):
            return start + self._text_opening + orjson.dumps(chunk.content) + self._text_closing
        obj = self._body(chunk)
        if chunk.logprobs:
            obj["logprobs"] = list(chunk.logprobs)
        obj["done"] = chunk.done
        if chunk.done:
            obj["done_reason"] = chunk.done_reason or "stop"
            if chunk.context:
                obj["context"] = list(chunk.context)
            obj.update(timings(gen.timings(chunk)))
        return start + json_bytes(obj)[1:] + b"\n"

    @staticmethod
    def _wanted(chunk: Chunk) -> bool:
        return chunk.done or bool(chunk.content or chunk.thinking or chunk.logprobs)

    def encode(self, batch: list[Chunk], gen: Generation) -> bytes:
        # One timestamp per wake-up.
        start = self._prefix + rfc3339_now().encode() + b'",'
        if len(batch) == 1:  # most wake-ups
            return self._line(start, batch[0], gen) if self._wanted(batch[0]) else b""
        return b"".join(self._line(start, c, gen) for c in batch if self._wanted(c))

    def error(self, message: str, status: int) -> bytes:
        return json_bytes({"error": message}) + b"\n"

    def end(self) -> bytes:
        return b""


class ChatLines(GenerateLines):
    """``/api/chat`` lines."""

    _text_opening = b'"message":{"role":"assistant","content":'
    _text_closing = b'},"done":false}\n'
    _empty: ClassVar[Mapping[str, Any]] = {"message": {"role": "assistant", "content": ""}}

    def _body(self, chunk: Chunk) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": chunk.content}
        if chunk.thinking:
            message["thinking"] = chunk.thinking
        if chunk.tool_calls:
            message["tool_calls"] = [call.to_ollama() for call in chunk.tool_calls]
        return {"message": message}

    @staticmethod
    def _wanted(chunk: Chunk) -> bool:
        return chunk.done or bool(
            chunk.content or chunk.thinking or chunk.tool_calls or chunk.logprobs
        )
