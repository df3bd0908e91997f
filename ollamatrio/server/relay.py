"""The token relay: one generation's lease and engine stream, and the encoders that turn its
chunks into wire bytes.

Typed chunks come in, a batch per engine wake-up (everything the runner sent since the last
read); each encoder turns a whole batch into one piece of bytes, so a relay writes to its
client once per wake-up and a token that arrives alone is written at once.  The same
:class:`Generation` feeds every format: native NDJSON (``/api/generate``, ``/api/chat``),
OpenAI server-sent events (``/v1/completions``, ``/v1/chat/completions``) and the folded
single object of ``"stream": false``.  Errors stay exceptions until an encoder writes them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager, nullcontext
from typing import Any, Protocol

import orjson
import trio

from ..engines.protocol import Chunk, CompletionRequest
from ..scheduler import Lease, ModelRequest, Scheduler
from . import openai_wire as oai
from .openai_wire import SSE, SSE_DONE
from .wire import NDJSON, json_bytes, ns, rfc3339, rfc3339_now


class Generation:
    """A generation in progress: valid inside :func:`open_generation`'s block, which owns
    the lease and the engine stream and closes both when the request ends (also by
    cancellation: a client that leaves, or shutdown)."""

    def __init__(self, lease: Lease, stream: Any, started: float) -> None:
        self.lease = lease
        self._stream = stream
        self._next = getattr(stream, "next_batch", None)
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
        if self._next is not None:
            batch: list[Chunk] = await self._next()
        else:  # an engine without batches: one chunk per wake-up
            try:
                batch = [await self._stream.__anext__()]
            except StopAsyncIteration:
                batch = []
        if not batch:
            batch = [Chunk(done=True, done_reason="stop")]
        if self.first_content_at is None and any(_content(c) for c in batch):
            self.first_content_at = trio.current_time()
        for i, chunk in enumerate(batch):
            if chunk.done:
                self.final = chunk
                return batch[: i + 1]
        return batch

    def timings(self, chunk: Chunk) -> dict[str, Any]:
        """Ollama's final counts and nanosecond durations."""
        return {
            "total_duration": ns(trio.current_time() - self.started),
            "load_duration": ns(self.load_duration),
            "prompt_eval_count": chunk.prompt_eval_count,
            "prompt_eval_duration": chunk.prompt_eval_duration,
            "eval_count": chunk.eval_count,
            "eval_duration": chunk.eval_duration,
        }


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


# -- native NDJSON -----------------------------------------------------------------------


class GenerateLines:
    """``/api/generate`` lines."""

    content_type = NDJSON
    # A line that carries only text (most of them) is spliced from bytes, not encoded
    # from a dict: ``{"model":…,"created_at":…,`` + opening + the text + closing.  orjson
    # writes a string exactly as json_bytes does, ten times faster.
    _text_opening = b'"response":'
    _text_closing = b',"done":false}\n'

    def __init__(self, model: str) -> None:
        self._prefix = b'{"model":' + json_bytes(model) + b',"created_at":"'

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
            obj.update(gen.timings(chunk))
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

    def _body(self, chunk: Chunk) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": chunk.content}
        if chunk.thinking:
            message["thinking"] = chunk.thinking
        if chunk.tool_calls:
            message["tool_calls"] = [dict(call) for call in chunk.tool_calls]
        return {"message": message}

    @staticmethod
    def _wanted(chunk: Chunk) -> bool:
        return chunk.done or bool(
            chunk.content or chunk.thinking or chunk.tool_calls or chunk.logprobs
        )


# -- OpenAI server-sent events -----------------------------------------------------------


def _sse(obj: Any) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


def _usage(chunk: Chunk) -> dict[str, int]:
    return {
        "prompt_tokens": chunk.prompt_eval_count,
        "completion_tokens": chunk.eval_count,
        "total_tokens": chunk.prompt_eval_count + chunk.eval_count,
    }


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


# -- "stream": false ---------------------------------------------------------------------


class Fold:
    """The chunks of a whole generation folded into Ollama's one final object."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._thinking: list[str] = []
        self.tool_calls: list[Mapping[str, Any]] = []
        self.logprobs: list[Mapping[str, Any]] = []

    def add(self, batch: list[Chunk]) -> None:
        for chunk in batch:
            self._content.append(chunk.content)
            self._thinking.append(chunk.thinking)
            self.tool_calls.extend(chunk.tool_calls)
            self.logprobs.extend(chunk.logprobs)

    def _final(self, gen: Generation) -> dict[str, Any]:
        chunk = gen.final or Chunk(done=True, done_reason="stop")
        out: dict[str, Any] = {"done": True, "done_reason": chunk.done_reason or "stop"}
        if chunk.context:
            out["context"] = list(chunk.context)
        out.update(gen.timings(chunk))
        if self.logprobs:
            out["logprobs"] = [dict(p) for p in self.logprobs]
        return out

    def generate(self, model: str, gen: Generation) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": model,
            "created_at": rfc3339(),
            "response": "".join(self._content),
        }
        thinking = "".join(self._thinking)
        if thinking:
            out["thinking"] = thinking
        out.update(self._final(gen))
        return out

    def chat(self, model: str, gen: Generation) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content)}
        thinking = "".join(self._thinking)
        if thinking:
            message["thinking"] = thinking
        if self.tool_calls:
            message["tool_calls"] = [dict(call) for call in self.tool_calls]
        out: dict[str, Any] = {"model": model, "created_at": rfc3339(), "message": message}
        out.update(self._final(gen))
        return out
