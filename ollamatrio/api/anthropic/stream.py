"""The Anthropic dialect's stream encoder: ``/v1/messages`` server-sent events, one piece of
bytes per engine wake-up.

Anthropic's sequence: ``message_start`` and a ``ping``, then each content block as
``content_block_start``, its deltas (``thinking_delta``, ``text_delta``,
``input_json_delta``) and ``content_block_stop``, then ``message_delta`` with the stop reason
and the usage, and ``message_stop``.  A block stays open while the model goes on with the
same kind of output; thinking, text and each tool call are blocks of their own.
"""

from __future__ import annotations

import json
from typing import Any

from ...generation.relay import Generation
from ...types import Chunk, ToolCall
from ...wire import SSE, json_bytes
from . import wire


def event(kind: str, data: dict[str, Any]) -> bytes:
    """One server-sent event: its type as the event name and in the data."""
    return b"event: " + kind.encode() + b"\ndata: " + json_bytes({"type": kind, **data}) + b"\n\n"


class MessageEvents:
    """One streamed ``message``: its id stays fixed, its blocks are numbered as they open."""

    content_type = SSE

    def __init__(self, model: str) -> None:
        self.id = wire.new_message_id()
        self.model = model
        self._started = False
        self._index = -1  # the latest block's
        self._open: str | None = None  # the open block's type ("text", "thinking"), if any
        self._tool_calls = 0

    def encode(self, batch: list[Chunk], gen: Generation) -> bytes:
        out = bytearray()
        if not self._started:
            self._started = True
            out += self._message_start()
        for chunk in batch:
            if chunk.thinking:
                out += self._delta(
                    "thinking", {"type": "thinking_delta", "thinking": chunk.thinking}
                )
            if chunk.content:
                out += self._delta("text", {"type": "text_delta", "text": chunk.content})
            for call in chunk.tool_calls:
                out += self._tool_use(call)
            if chunk.done:
                out += self._message_end(chunk)
        return bytes(out)

    def _message_start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": wire.usage(0, 0),
        }  # fmt: skip
        return event("message_start", {"message": message}) + event("ping", {})

    def _delta(self, kind: str, delta: dict[str, Any]) -> bytes:
        out = b""
        if self._open != kind:
            block: dict[str, Any] = {"type": kind, kind: ""}
            if kind == "thinking":
                block["signature"] = ""
            out += self._start_block(block)
            self._open = kind
        return out + event("content_block_delta", {"index": self._index, "delta": delta})

    def _start_block(self, block: dict[str, Any]) -> bytes:
        out = self._stop_block()
        self._index += 1
        return out + event("content_block_start", {"index": self._index, "content_block": block})

    def _stop_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return event("content_block_stop", {"index": self._index})

    def _tool_use(self, call: ToolCall) -> bytes:
        """A whole tool call: the model's calls come complete, so one ``input_json_delta``."""
        self._tool_calls += 1
        out = self._start_block(wire.tool_use_block(call, empty_input=True))
        arguments = json.dumps(wire.tool_input(call), separators=(",", ":"), ensure_ascii=False)
        delta = {"type": "input_json_delta", "partial_json": arguments}
        out += event("content_block_delta", {"index": self._index, "delta": delta})
        out += event("content_block_stop", {"index": self._index})
        return out

    def _message_end(self, chunk: Chunk) -> bytes:
        out = b""
        if self._index < 0:  # nothing came: one empty text block, as the whole object has
            out += self._start_block({"type": "text", "text": ""})
            self._open = "text"
        out += self._stop_block()
        delta = wire.stop_fields(
            chunk.done_reason or "stop", chunk.stop_sequence, self._tool_calls > 0
        )
        usage = wire.usage(chunk.prompt_eval_count, chunk.eval_count, chunk.prompt_cached_count)
        out += event("message_delta", {"delta": delta, "usage": usage})
        return out + event("message_stop", {})

    def error(self, message: str, status: int) -> bytes:
        error = wire.error_object(message, status)
        return b"event: error\ndata: " + json_bytes(error) + b"\n\n"

    def end(self) -> bytes:
        return b""
