"""The OpenAI Responses dialect's stream encoder: ``/v1/responses`` server-sent events
(``event:`` and ``data:`` lines), one piece of bytes per engine wake-up.

The order is the one the ``openai`` SDK's stream helper follows: ``response.created`` and
``response.in_progress``; for thinking a ``reasoning`` item with its summary text deltas;
for text a ``message`` item, its ``output_text`` part and its deltas; each item closed with
its ``.done`` events before the next opens; a function call as its item opens when the model
starts writing it (``response.output_item.added`` with its name and ``call_id``), its
arguments as ``response.function_call_arguments.delta`` as they are written, and its
``.done`` events once the answer is complete (a call an engine gives only whole is all four
events at the end); then ``response.completed`` (or ``response.incomplete``) with the same
object ``"stream": false`` answers.
"""

from __future__ import annotations

from typing import Any

from ...generation.answer import Answer, Fold
from ...generation.relay import Generation
from ...types import Chunk, ToolCall, ToolCallDelta
from ...wire import SSE, json_bytes
from ..openai import wire as openai_wire
from . import wire


class ResponseEvents:
    """One streamed response; ``on_answer`` sees the folded answer when it is done."""

    content_type = SSE

    def __init__(self, draft: wire.Draft) -> None:
        self.draft = draft
        self._sequence = 0
        self._started = False
        self._items = 0  # output items opened so far
        self._reasoning: int | None = None  # the open reasoning item's output index
        self._message: int | None = None  # the open message item's output index
        self._message_done = False
        self._calls: dict[int, int] = {}  # a call's index among the answer's -> its item's
        self._call_ids: dict[int, str] = {}  # a streamed call's index -> its id, once known
        self._call_args: dict[int, list[str]] = {}  # a streamed call's arguments so far
        self._text: list[str] = []
        self._thinking: list[str] = []
        self._fold = Fold()
        self.answer: Answer | None = None  # once the done chunk was encoded

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + json_bytes(data) + b"\n\n"

    def encode(self, batch: list[Chunk], gen: Generation) -> bytes:
        self._fold.add(batch)
        out = bytearray()
        if not self._started:
            self._started = True
            response = self.draft.envelope("in_progress", [])
            out += self._event("response.created", response=response)
            out += self._event("response.in_progress", response=response)
        for chunk in batch:
            # Items are written in order and never reopened: thinking after the text, or
            # text after a call began, is in the final object but not streamed.
            if chunk.thinking and self._message is None and not (self._message_done or self._calls):
                out += self._think(chunk.thinking)
            if chunk.content and not self._calls:
                out += self._write(chunk.content)
            for delta in chunk.tool_call_deltas:
                out += self._call_delta(delta)
            if chunk.done:
                out += self._finish(gen)
        return bytes(out)

    def _think(self, text: str) -> bytes:
        out = b""
        if self._reasoning is None:
            self._reasoning = self._open()
            item = {**wire.reasoning_item(self.draft, ""), "summary": []}
            out += self._event("response.output_item.added", output_index=self._reasoning,
                               item=item)  # fmt: skip
            out += self._event(
                "response.reasoning_summary_part.added", item_id=item["id"],
                output_index=self._reasoning, summary_index=0,
                part={"type": "summary_text", "text": ""},
            )  # fmt: skip
        self._thinking.append(text)
        return out + self._event(
            "response.reasoning_summary_text.delta", item_id=self.draft.item_id("rs"),
            output_index=self._reasoning, summary_index=0, delta=text,
        )  # fmt: skip

    def _close_reasoning(self) -> bytes:
        if self._reasoning is None:
            return b""
        index, self._reasoning = self._reasoning, None
        text = "".join(self._thinking)
        item = wire.reasoning_item(self.draft, text)
        part = {"type": "summary_text", "text": text}
        return (
            self._event("response.reasoning_summary_text.done", item_id=item["id"],
                        output_index=index, summary_index=0, text=text)
            + self._event("response.reasoning_summary_part.done", item_id=item["id"],
                          output_index=index, summary_index=0, part=part)
            + self._event("response.output_item.done", output_index=index, item=item)
        )  # fmt: skip

    def _write(self, text: str) -> bytes:
        out = b""
        if self._message is None:
            out += self._close_reasoning()
            self._message = self._open()
            item = wire.message_item(self.draft, "", status="in_progress")
            out += self._event("response.output_item.added", output_index=self._message,
                               item=item)  # fmt: skip
            out += self._event(
                "response.content_part.added", item_id=item["id"], output_index=self._message,
                content_index=0, part=wire.output_text(""),
            )  # fmt: skip
        self._text.append(text)
        return out + self._event(
            "response.output_text.delta", item_id=self.draft.item_id("msg"),
            output_index=self._message, content_index=0, delta=text, logprobs=[],
        )  # fmt: skip

    def _close_message(self) -> bytes:
        if self._message is None:
            return b""
        index, self._message = self._message, None
        self._message_done = True
        text = "".join(self._text)
        item = wire.message_item(self.draft, text)
        return (
            self._event("response.output_text.done", item_id=item["id"], output_index=index,
                        content_index=0, text=text, logprobs=[])
            + self._event("response.content_part.done", item_id=item["id"],
                          output_index=index, content_index=0, part=wire.output_text(text))
            + self._event("response.output_item.done", output_index=index, item=item)
        )  # fmt: skip

    def _call_delta(self, delta: ToolCallDelta) -> bytes:
        out = b""
        index = self._calls.get(delta.index)
        if index is None:
            out += self._close_reasoning() + self._close_message()
            index = self._calls[delta.index] = self._open()
            call = ToolCall(delta.name, id=delta.id)
            item = wire.function_call_item(self.draft, call, delta.index, status="in_progress")
            out += self._event("response.output_item.added", output_index=index, item=item)
        if delta.id:
            self._call_ids.setdefault(delta.index, delta.id)
        self._call_args.setdefault(delta.index, []).append(delta.arguments)
        if delta.arguments:
            out += self._event(
                "response.function_call_arguments.delta",
                item_id=self.draft.item_id("fc", delta.index), output_index=index,
                delta=delta.arguments,
            )  # fmt: skip
        return out

    def _open(self) -> int:
        self._items += 1
        return self._items - 1

    def _finish(self, gen: Generation) -> bytes:
        answer = self._fold.answer(gen)
        self.answer = answer
        out = self._close_reasoning()
        if self._message is None and not self._message_done and not answer.tool_calls:
            out += self._write("")  # an empty answer is still one (empty) message
        out += self._close_message()
        streamed = self._streamed_places(answer.tool_calls)
        for n, call in enumerate(answer.tool_calls):
            place = streamed.get(n)
            index = self._calls.get(place) if place is not None else None
            item = wire.function_call_item(self.draft, call, n if place is None else place)
            if index is None:  # the engine gave this call only whole
                index = self._open()
                added = wire.function_call_item(self.draft, call, n, status="in_progress")
                out += self._event("response.output_item.added", output_index=index, item=added)
                out += self._event(
                    "response.function_call_arguments.delta", item_id=item["id"],
                    output_index=index, delta=item["arguments"],
                )  # fmt: skip
            out += self._event(
                "response.function_call_arguments.done", item_id=item["id"],
                output_index=index, arguments=item["arguments"],
            )  # fmt: skip
            out += self._event("response.output_item.done", output_index=index, item=item)
        out += self._close_malformed(set(streamed.values()))
        response = wire.response_object(self.draft, answer)
        return out + self._event(f"response.{response['status']}", response=response)

    def _streamed_places(self, calls: tuple[ToolCall, ...] | list[ToolCall]) -> dict[int, int]:
        """Which streamed call each of the answer's calls is: by id, else by place.  A call
        that proved malformed is in the answer as text, so places can shift past it."""
        by_id = {call_id: place for place, call_id in self._call_ids.items()}
        places: dict[int, int] = {}
        for n, call in enumerate(calls):
            place = by_id.get(call.id) if call.id else None
            if place is None and not call.id and n in self._calls and n not in self._call_ids:
                place = n
            if place is not None:
                places[n] = place
        return places

    def _close_malformed(self, answered: set[int]) -> bytes:
        """Close the items of streamed calls that proved malformed (the answer has them as
        text): ``incomplete``, with the arguments as they were written, so no item the
        stream opened is left open."""
        out = b""
        for place, index in self._calls.items():
            if place in answered:
                continue
            arguments = "".join(self._call_args.get(place, []))
            call = ToolCall("", id=self._call_ids.get(place, ""))
            item = {
                **wire.function_call_item(self.draft, call, place, status="incomplete"),
                "arguments": arguments,
            }
            out += self._event(
                "response.function_call_arguments.done", item_id=item["id"],
                output_index=index, arguments=arguments,
            )  # fmt: skip
            out += self._event("response.output_item.done", output_index=index, item=item)
        return out

    def error(self, message: str, status: int) -> bytes:
        error = openai_wire.error_object(message, status)["error"]
        return self._event("error", code=error["type"], message=message, param=None)

    def end(self) -> bytes:
        return b""
