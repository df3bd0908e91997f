"""The typed requests every dialect translates into: what a generation or an embedding asks
for, in the core's own terms, independent of any wire format.

Each dialect (``api/native_wire.py``, ``api/openai_wire.py``, ...) reads its body into one of
these frozen records and checks it there; from then on the model checks, the completion
request (:mod:`.completion`), the relay and the folded answer (:mod:`.answer`) see only the
record.  Nothing here parses a body: that is a dialect's job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# A structured-output constraint: "json", or a JSON schema; None: free text.
Format = str | Mapping[str, Any] | None
# Thinking: off, on, or a level ("low", "medium", "high", "max"); None: the model's default.
Think = bool | str | None


@dataclass(frozen=True)
class ToolCall:
    """One function call, asked for by the model (an answer) or shown to it (history).

    ``arguments`` is an object; a string only where a model wrote arguments that are not
    JSON (they are passed on as written)."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str = ""  # the call's id, when the model or the client gave one
    index: int = 0  # position among the calls of one message (Ollama's function.index)

    @classmethod
    def from_chunk(cls, call: Mapping[str, Any]) -> ToolCall:
        """A call as an engine reports it in a :class:`~ollamatrio.types.Chunk` (Ollama's
        shape: ``{"function": {"name", "arguments"}, "id"?}``)."""
        function = call.get("function") or {}
        arguments = function.get("arguments")
        return cls(
            name=str(function.get("name") or ""),
            arguments={} if arguments is None else arguments,
            id=str(call.get("id") or ""),
            index=int(function.get("index") or 0),
        )

    def to_ollama(self) -> dict[str, Any]:
        """Ollama's JSON shape, zero fields left out (the engines and native answers)."""
        function: dict[str, Any] = {"name": self.name, "arguments": self.arguments}
        if self.index:
            function["index"] = self.index
        out: dict[str, Any] = {"function": function}
        if self.id:
            out["id"] = self.id
        return out


@dataclass(frozen=True)
class Message:
    """One turn of a conversation."""

    role: str  # "system", "user", "assistant", "tool", or another role a template knows
    content: str = ""
    thinking: str = ""  # an assistant's earlier reasoning
    images: tuple[str, ...] = ()  # base64
    tool_calls: tuple[ToolCall, ...] = ()
    tool_name: str = ""  # a tool result: the function it answers
    tool_call_id: str = ""  # a tool result: the call it answers

    def to_ollama(self) -> dict[str, Any]:
        """Ollama's ``api.Message`` JSON, empty fields left out: what the engines and the Go
        templates read."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.thinking:
            out["thinking"] = self.thinking
        if self.images:
            out["images"] = list(self.images)
        if self.tool_calls:
            out["tool_calls"] = [call.to_ollama() for call in self.tool_calls]
        if self.tool_name:
            out["tool_name"] = self.tool_name
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass(frozen=True)
class GenerateRequest:
    """A completion of one prompt (Ollama's ``/api/generate``, OpenAI's ``/v1/completions``)."""

    model: str
    prompt: str = ""
    suffix: str = ""  # fill-in-the-middle: the text after the gap
    system: str = ""
    template: str = ""  # a Go template for this request only
    context: tuple[int, ...] = ()  # token ids of an earlier prompt and answer to go on from
    raw: bool = False  # the prompt as is: no template, no system prompt
    format: Format = None
    images: tuple[str, ...] = ()  # base64
    options: Mapping[str, Any] = field(default_factory=dict)  # checked, not yet merged
    keep_alive: float | None = None  # seconds; None: the server's default
    think: Think = None
    stream: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    shift: bool | None = None  # context shift; None: the model's default (B27)
    truncate: bool = True  # cut a prompt that does not fit the context from the front

    @property
    def has_images(self) -> bool:
        return bool(self.images)


@dataclass(frozen=True)
class ChatRequest:
    """A reply to a conversation (Ollama's ``/api/chat``, OpenAI's ``/v1/chat/completions``)."""

    model: str
    messages: tuple[Message, ...] = ()
    # Function definitions, JSON schemas passed to the model's template as they came.
    tools: tuple[Mapping[str, Any], ...] = ()
    format: Format = None
    options: Mapping[str, Any] = field(default_factory=dict)  # checked, not yet merged
    keep_alive: float | None = None  # seconds; None: the server's default
    think: Think = None
    stream: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    truncate: bool = True  # drop the oldest messages that do not fit the context
    shift: bool | None = None  # context shift; None: the model's default (B27)

    @property
    def has_images(self) -> bool:
        return any(m.images for m in self.messages)


@dataclass(frozen=True)
class EmbedRequest:
    """Embeddings of some texts; none only loads the model."""

    model: str
    inputs: tuple[str, ...] = ()
    truncate: bool = True  # cut an input that does not fit the context
    dimensions: int | None = None  # keep the first this many (then normalise)
    options: Mapping[str, Any] = field(default_factory=dict)  # checked, not yet merged
    keep_alive: float | None = None  # seconds; None: the server's default
