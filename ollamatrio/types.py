"""Records shared across the layers: what a load is, what memory a model uses, what one
completion asks for (its messages and tool calls typed) and what it yields.

A leaf module: it imports nothing of the project, so the runner child, the fact modules, the
engines, the scheduler and every API dialect can share these records without importing each
other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LoadSpec:
    """Everything needed to load one model; the scheduler decides every field."""

    model_path: str
    name: str  # alias the runner reports as its model name
    num_ctx: int = 2048  # per slot; the runner allocates num_ctx * num_parallel
    num_parallel: int = 1
    num_batch: int = 512
    num_thread: int = 0  # 0: let the engine decide
    # With num_thread 0: the CPU cores the scheduler divides (its thread pool's size, of
    # which the scheduler gives it a share while it runs; scheduler/core_share.py).  0: the
    # engine's own default.
    cores: int = 0
    num_gpu: int = 0  # layers offloaded to GPUs; 0 = CPU only, -1 = all
    main_gpu: int | None = None
    tensor_split: tuple[float, ...] = ()  # proportions per entry of gpu_ids
    gpu_ids: tuple[str, ...] = ()  # devices this load may use (GpuInfo.id)
    kv_cache_type: str = "f16"  # both sides' (ollamatrio/kv_cache.py names them)
    kv_cache_type_k: str = ""  # the K cache's, when not kv_cache_type
    kv_cache_type_v: str = ""  # the V cache's, when not kv_cache_type
    flash_attention: bool | None = None  # None: engine decides (auto)
    use_mmap: bool = True
    embedding: bool = False
    pooling: str | None = None  # mean | cls | last | none; None: from the model
    adapters: tuple[str, ...] = ()  # LoRA files
    projector: str | None = None  # multimodal projector file
    chat_template: str | None = None  # override of the model's own template
    # Ollama's context shift: a generation that fills the context drops its oldest tokens
    # (after num_keep) and goes on, instead of stopping with done_reason "length".
    context_shift: bool = True
    # llama.cpp's host-RAM prompt cache (``cache_ram_mib``): slot states that lost their slot
    # are kept here and restored instead of re-evaluated.  Host memory the placement counts
    # (scheduler/prompt_cache.py decides it); 0 turns the cache off.
    prompt_cache_mib: int = 0
    # Speculative decoding by a model: ``draft_model`` is a draft model's file (same
    # vocabulary), ``mtp`` loads the model's own multi-token-prediction heads; either drafts
    # at most ``draft_num_predict`` tokens per step.  ``draft_gpu_layers``: -1 puts the draft
    # model on the GPU with the target, 0 keeps it on the CPU.
    draft_model: str | None = None
    draft_gpu_layers: int = 0
    mtp: bool = False
    draft_num_predict: int = 0
    # The drafter for speculative decoding (ollamatrio/speculative.py): none | ngram | draft.
    speculative: str = "none"


@dataclass(frozen=True)
class MemoryUsage:
    """Memory a loaded model really uses (measured) or is predicted to use."""

    total: int  # bytes, host + devices
    vram_by_gpu: Mapping[str, int] = field(default_factory=dict)  # GpuInfo.id -> bytes

    @property
    def vram(self) -> int:
        return sum(self.vram_by_gpu.values())


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


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
    def from_ollama(cls, call: Mapping[str, Any]) -> ToolCall:
        """A call in Ollama's JSON shape (``{"function": {"name", "arguments", "index"?},
        "id"?}``), read leniently: a stored model's messages are not checked requests."""
        function = call.get("function")
        if not isinstance(function, Mapping):
            function = {}
        arguments = function.get("arguments")
        index = function.get("index")
        return cls(
            name=_text(function.get("name")),
            arguments=arguments if isinstance(arguments, Mapping | str) else {},
            id=_text(call.get("id")),
            index=index if isinstance(index, int) and not isinstance(index, bool) else 0,
        )

    def to_ollama(self) -> dict[str, Any]:
        """Ollama's JSON shape, zero fields left out (native answers, Go templates)."""
        function: dict[str, Any] = {"name": self.name, "arguments": self.arguments}
        if self.index:
            function["index"] = self.index
        out: dict[str, Any] = {"function": function}
        if self.id:
            out["id"] = self.id
        return out


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call as the model writes it: the call's place among the answer's
    calls, its id and name when it starts, then pieces of its arguments' JSON text.  Only
    dialects that stream calls as they are written read these; every call also comes whole
    (``Chunk.tool_calls``) once the answer is complete."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


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

    @classmethod
    def from_ollama(cls, message: Mapping[str, Any]) -> Message:
        """Ollama's ``api.Message`` JSON (a stored model's ``messages`` layer), read
        leniently: fields of the wrong type read as empty."""
        images = message.get("images")
        calls = message.get("tool_calls")
        return cls(
            role=_text(message.get("role")),
            content=_text(message.get("content")),
            thinking=_text(message.get("thinking")),
            images=tuple(i for i in images if isinstance(i, str))
            if isinstance(images, list | tuple)
            else (),
            tool_calls=tuple(ToolCall.from_ollama(c) for c in calls if isinstance(c, Mapping))
            if isinstance(calls, list | tuple)
            else (),
            tool_name=_text(message.get("tool_name")),
            tool_call_id=_text(message.get("tool_call_id")),
        )

    def to_ollama(self) -> dict[str, Any]:
        """Ollama's ``api.Message`` JSON, empty fields left out (what the Go templates
        read)."""
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
class ToolChoice:
    """Whether the answer must be a tool call (the ``tool_choice`` of the OpenAI and
    Anthropic dialects; ``none`` never gets here: the dialect offers no tools then)."""

    required: bool = False  # a call, not text
    name: str = ""  # with ``required``: the one function the call must name


@dataclass(frozen=True)
class CompletionRequest:
    """One generation request in Ollama's terms; engines translate it for llama.cpp.

    Exactly one of ``prompt`` (sent as is, already templated or raw) and ``messages``
    (rendered with the model's chat template by llama.cpp) is set.  Messages stay typed up
    to the engine, which writes them in its own wire format.
    """

    prompt: str | None = None
    messages: Sequence[Message] | None = None
    suffix: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)  # Ollama sampling options
    format: str | Mapping[str, Any] | None = None  # "json" or a JSON schema
    tools: Sequence[Mapping[str, Any]] | None = None
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    think: bool | str | None = None
    images: Sequence[str] = ()  # base64
    logprobs: bool = False
    top_logprobs: int = 0
    # Messages: drop the oldest (never system messages, never the latest) until the rendered
    # conversation fits the context, as Ollama's chatPrompt does.
    truncate: bool = True
    # Name the stop sequence that ended the answer on the final chunk (``stop_sequence``).
    # A prompt's always does (llama.cpp reports it); a chat's only when asked, since
    # llama.cpp's chat stream does not say, and matching them here costs every token.
    report_stop: bool = False
    # /api/generate's deprecated ``context``: token ids of an earlier prompt and answer to
    # continue from (detokenized in front of this prompt, as Ollama does), and whether the
    # final chunk should carry this prompt and answer as token ids.
    context: tuple[int, ...] = ()
    return_context: bool = False


@dataclass(frozen=True)
class Chunk:
    """One streamed piece of a generation; the last one has ``done=True`` and the counts."""

    content: str = ""
    thinking: str = ""
    tool_calls: Sequence[ToolCall] = ()  # the calls the model asked for
    tool_call_deltas: Sequence[ToolCallDelta] = ()  # those calls as they are being written
    # Ollama's logprobs of the tokens in this piece: {token, logprob, bytes, top_logprobs?}
    logprobs: Sequence[Mapping[str, Any]] = ()
    done: bool = False
    done_reason: str | None = None  # "stop" | "length"
    stop_sequence: str = ""  # on the final chunk: the stop sequence that ended the answer
    # The whole prompt, reused tokens included (as Ollama counts it); the duration covers only
    # the part that was evaluated, and ``prompt_cached_count`` says how much was reused.
    prompt_eval_count: int = 0
    prompt_eval_duration: int = 0  # ns
    prompt_cached_count: int = 0  # tokens of the prompt taken from the cache, not evaluated
    eval_count: int = 0
    eval_duration: int = 0  # ns
    # Speculative decoding, on the final chunk of a runner that drafts (None: it does not):
    # tokens the drafter proposed, and how many of them the model accepted.
    draft_count: int | None = None
    draft_accepted_count: int | None = None
    context: tuple[int, ...] = ()  # on the final chunk, when the request asked for it
    # On the final chunk: tool calls the model wrote malformed (returned as text instead).
    malformed_tool_calls: int = 0


@dataclass(frozen=True)
class Embeddings:
    vectors: list[list[float]]  # L2-normalised
    prompt_eval_count: int = 0


@dataclass(frozen=True)
class Ranking:
    """A reranker's relevance scores, one per document in the order given (higher: more
    relevant; a model's raw score, not a probability)."""

    scores: list[float]
    prompt_eval_count: int = 0
