"""The typed requests every dialect translates into: what a generation or an embedding asks
for, in the core's own terms, independent of any wire format.

Each dialect (``api/native/wire.py``, ``api/openai/wire.py``, ...) reads its body into one of
these frozen records and checks it there; from then on the model checks, the completion
request (:mod:`.completion`), the relay and the folded answer (:mod:`.answer`) see only the
record.  Nothing here parses a body: that is a dialect's job.  A conversation's
:class:`~ollamatrio.types.Message` and :class:`~ollamatrio.types.ToolCall` live in the
leaf :mod:`ollamatrio.types`, since the engines read them too; they are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..types import Message as Message
from ..types import ToolCall as ToolCall
from ..types import ToolChoice as ToolChoice

# A structured-output constraint: "json", or a JSON schema; None: free text.
Format = str | Mapping[str, Any] | None
# Thinking: off, on, or a level ("low", "medium", "high", "max"); None: the model's default.
Think = bool | str | None


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
    shift: bool | None = None  # context shift; None: the model's default (off for deepseek2)
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
    tool_choice: ToolChoice = field(default_factory=ToolChoice)  # must it be a call (of one tool)?
    format: Format = None
    options: Mapping[str, Any] = field(default_factory=dict)  # checked, not yet merged
    keep_alive: float | None = None  # seconds; None: the server's default
    think: Think = None
    stream: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    truncate: bool = True  # drop the oldest messages that do not fit the context
    shift: bool | None = None  # context shift; None: the model's default (off for deepseek2)
    # The dialect says which stop sequence ended the answer (Anthropic's stop_sequence):
    # the final chunk must name it, which costs a chat its own matching (llamacpp_wire).
    report_stop: bool = False

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


@dataclass(frozen=True)
class RerankRequest:
    """Documents scored against a query by a reranker (a cross-encoder); none only loads
    the model."""

    model: str
    query: str = ""
    documents: tuple[str, ...] = ()
    top_n: int | None = None  # keep the best this many; None: all
    return_documents: bool = False  # each result carries its document's text
    options: Mapping[str, Any] = field(default_factory=dict)  # checked, not yet merged
    keep_alive: float | None = None  # seconds; None: the server's default
