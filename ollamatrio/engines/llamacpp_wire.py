"""Translate between Ollama's terms and llama.cpp server's HTTP API (pure, no I/O).

Requests: a prompt goes to ``/completion`` (or ``/infill`` with a suffix), messages go to
``/v1/chat/completions`` so the model's own chat template applies; typed messages and tool
calls become llama.cpp's (OpenAI-shaped) JSON here and nowhere else.  Every Ollama sampling
option is sent explicitly with Ollama's default, since llama.cpp's request defaults differ
(engine.md §10.8).  Responses: SSE ``data:`` events become :class:`Chunk` objects, with
llama.cpp's ``timings`` turned into Ollama's counts and nanosecond durations, and its tool
call deltas joined into :class:`ToolCall` records.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ollamatrio.errors import InvalidRequestError, PeerReportedError
from ollamatrio.types import Chunk, CompletionRequest, Message, ToolCall, ToolCallDelta

from .forced_call import as_text, call_schema, forced_call, is_malformed

# Ollama option -> (llama.cpp request field, Ollama's default).
SAMPLING_OPTIONS: dict[str, tuple[str, Any]] = {
    "temperature": ("temperature", 0.8),
    "top_k": ("top_k", 40),
    "top_p": ("top_p", 0.9),
    "min_p": ("min_p", 0.0),
    "typical_p": ("typical_p", 1.0),
    "repeat_last_n": ("repeat_last_n", 64),
    "repeat_penalty": ("repeat_penalty", 1.0),
    "presence_penalty": ("presence_penalty", 0.0),
    "frequency_penalty": ("frequency_penalty", 0.0),
    "seed": ("seed", -1),
    "num_keep": ("n_keep", 4),
}
# llama.cpp request fields passed through unchanged when present in options (benchmarks and
# tests use them to get exactly N tokens out).
PASSTHROUGH_OPTIONS = ("ignore_eos", "logit_bias")
MAX_PREDICT_FACTOR = 10  # as Ollama: num_predict < 0 or > 10 * num_ctx is capped at that
JSON_FORMAT_SCHEMA: dict[str, Any] = {"type": "object"}


def n_predict(options: Mapping[str, Any], context_length: int) -> int:
    limit = MAX_PREDICT_FACTOR * context_length
    value = int(options.get("num_predict", -1) if options.get("num_predict") is not None else -1)
    return limit if value < 0 or value > limit else value


def sampling_fields(options: Mapping[str, Any], context_length: int) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for option, (name, default) in SAMPLING_OPTIONS.items():
        value = options.get(option)
        body[name] = default if value is None else value
    stop = options.get("stop")
    if stop:
        body["stop"] = [stop] if isinstance(stop, str) else list(stop)
    for name in PASSTHROUGH_OPTIONS:
        if name in options:
            body[name] = options[name]
    body["n_predict"] = n_predict(options, context_length)
    body["cache_prompt"] = True
    body["stream"] = True
    return body


def _format_schema(fmt: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(fmt, str):
        if fmt == "json":
            return dict(JSON_FORMAT_SCHEMA)
        if fmt == "":
            return {}
        raise InvalidRequestError(f'invalid format: {fmt!r}; expected "json" or a JSON schema')
    return dict(fmt)


def completion_request(req: CompletionRequest, context_length: int) -> tuple[str, dict[str, Any]]:
    """(path, body) for a prompt request."""
    if req.prompt is None:
        raise InvalidRequestError("a completion needs a prompt")
    body = sampling_fields(req.options, context_length)
    if req.format:
        body["json_schema"] = _format_schema(req.format)
    if req.suffix:
        body.update(input_prefix=req.prompt, input_suffix=req.suffix, prompt="")
        return "/infill", body
    body["prompt"] = req.prompt
    if req.logprobs:
        # n_probs also yields the chosen token's own log-probability: at least 1.
        body["n_probs"] = max(1, req.top_logprobs)
    return "/completion", body


def chat_request(
    req: CompletionRequest, context_length: int, model: str
) -> tuple[str, dict[str, Any]]:
    """(path, body) for a messages request, rendered by llama.cpp with the model's template."""
    if req.messages is None:
        raise InvalidRequestError("a chat needs messages")
    body = sampling_fields(req.options, context_length)
    if req.report_stop and body.pop("stop", None):
        # llama.cpp's chat stream does not say which stop sequence ended an answer, so the
        # sequences are matched here (ChatStream); timings on every event keep the counts
        # when the stream is closed at a match.
        body["timings_per_token"] = True
    body["model"] = model
    body["messages"] = [chat_message(m, i) for i, m in enumerate(req.messages)]
    if req.tools:
        body["tools"] = [dict(tool) for tool in req.tools]
        schema = call_schema(body["tools"], req.tool_choice)
        if schema is not None:  # a call is required: forced by a schema (forced_call.py)
            body["tool_choice"] = "none"
            body["json_schema"] = schema
    if req.logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = max(1, req.top_logprobs)  # 0 would report no probability
    if req.format and "json_schema" not in body:  # a forced call's schema is its format
        schema = _format_schema(req.format)
        if req.format == "json":
            body["response_format"] = {"type": "json_object"}
        elif schema:
            body["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
    if req.think is not None:
        kwargs: dict[str, Any] = {"enable_thinking": bool(req.think)}
        if isinstance(req.think, str):
            kwargs["enable_thinking"] = req.think not in ("", "false", "none")
            kwargs["reasoning_effort"] = req.think
        body["chat_template_kwargs"] = kwargs
    return "/v1/chat/completions", body


def _image_url(b64: str) -> str:
    mime = "image/jpeg" if b64.startswith("/9j/") else "image/png"
    return f"data:{mime};base64,{b64}"


def chat_message(message: Message, index: int = 0) -> dict[str, Any]:
    """One chat message in OpenAI shape (what llama.cpp's chat endpoint takes); ``index``
    names the ids of its tool calls that have none."""
    role = message.role or "user"
    text = message.content
    out: dict[str, Any] = {"role": role, "content": text}
    if message.images:
        parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        parts += [
            {"type": "image_url", "image_url": {"url": _image_url(i)}} for i in message.images
        ]
        out["content"] = parts
    if message.thinking:
        out["reasoning_content"] = message.thinking
    if message.tool_calls:
        out["tool_calls"] = [
            _openai_tool_call(call, index, n) for n, call in enumerate(message.tool_calls)
        ]
    if role == "tool":
        if message.tool_name:
            out["name"] = message.tool_name
        if message.tool_call_id:
            out["tool_call_id"] = message.tool_call_id
    return out


def _openai_tool_call(call: ToolCall, message_index: int, n: int) -> dict[str, Any]:
    arguments = call.arguments
    return {
        "id": call.id or f"call_{message_index}_{n}",
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }


class RunnerReportedError(PeerReportedError):
    """An error event inside a runner's stream (e.g. context overflow), or an answer of the
    runner's that does not add up."""


def parse_sse_line(line: str) -> dict[str, Any] | None:
    """The JSON payload of one SSE line; None for blank lines, comments and ``[DONE]``."""
    line = line.strip()
    for prefix in ("data:", "error:"):
        if line.startswith(prefix):
            payload = line[len(prefix) :].strip()
            if payload == "[DONE]":
                return None
            event: dict[str, Any] = json.loads(payload)
            if prefix == "error:" and "error" not in event:
                event = {"error": event}
            return event
    return None


def raise_for_error(event: Mapping[str, Any]) -> None:
    error = event.get("error")
    if error is None:
        return
    if isinstance(error, Mapping):
        message = str(error.get("message", error))
        raise RunnerReportedError(message, int(error.get("code", 500)), str(error.get("type", "")))
    raise RunnerReportedError(str(error))


class TimingCounts(TypedDict):
    """A final chunk's counts and durations, as :class:`~ollamatrio.types.Chunk` names them."""

    prompt_eval_count: int
    prompt_eval_duration: int  # ns
    prompt_cached_count: int
    eval_count: int
    eval_duration: int  # ns
    draft_count: int | None  # None: the runner drafts nothing
    draft_accepted_count: int | None


def timing_counts(timings: Mapping[str, Any] | None) -> TimingCounts:
    """llama.cpp timings -> Ollama's prompt_eval/eval counts and durations (ns).

    llama.cpp's ``prompt_n`` is only what it evaluated and ``cache_n`` what it reused (from
    the slot or the RAM prompt cache); Ollama's ``prompt_eval_count`` is the whole prompt, so
    it is their sum, while the duration stays that of the evaluated part.  A runner loaded
    with a drafter adds ``draft_n`` (tokens drafted) and ``draft_n_accepted`` (of them, those
    the model kept); one without reports neither."""
    t = timings or {}
    evaluated = int(t.get("prompt_n", 0) or 0)
    cached = int(t.get("cache_n", 0) or 0)
    drafted = t.get("draft_n")
    return {
        "prompt_eval_count": evaluated + cached,
        "prompt_eval_duration": round(float(t.get("prompt_ms", 0.0) or 0.0) * 1e6),
        "prompt_cached_count": cached,
        "eval_count": int(t.get("predicted_n", 0) or 0),
        "eval_duration": round(float(t.get("predicted_ms", 0.0) or 0.0) * 1e6),
        "draft_count": None if drafted is None else int(drafted),
        "draft_accepted_count": (
            None if drafted is None else int(t.get("draft_n_accepted", 0) or 0)
        ),
    }


def ollama_logprobs(
    probabilities: Sequence[Mapping[str, Any]] | None, top: int
) -> tuple[dict[str, Any], ...]:
    """llama.cpp's per-token probabilities (``completion_probabilities``, or a chat delta's
    ``logprobs.content``) in Ollama's shape: token, logprob, bytes, and ``top_logprobs`` only
    when some were asked for."""
    out = []
    for p in probabilities or ():
        item: dict[str, Any] = {"token": p.get("token", ""), "logprob": p.get("logprob", 0.0)}
        if p.get("bytes") is not None:
            item["bytes"] = p["bytes"]
        if top > 0:
            item["top_logprobs"] = [
                {"token": t.get("token", ""), "logprob": t.get("logprob", 0.0),
                 **({"bytes": t["bytes"]} if t.get("bytes") is not None else {})}
                for t in (p.get("top_logprobs") or ())[:top]
            ]  # fmt: skip
        out.append(item)
    return tuple(out)


class CompletionStream:
    """Parses ``/completion`` and ``/infill`` stream events."""

    def __init__(self, top_logprobs: int = 0) -> None:
        self.done = False
        self._top = top_logprobs

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        raise_for_error(event)
        content = event.get("content") or ""
        probabilities = event.get("completion_probabilities")
        logprobs = ollama_logprobs(probabilities, self._top) if probabilities else ()
        # A token that ends inside a UTF-8 sequence has no text yet, but has its logprob.
        piece = [Chunk(content=content, logprobs=logprobs)] if content or logprobs else []
        if not event.get("stop"):
            return piece
        self.done = True
        reason = "length" if event.get("stop_type") == "limit" else "stop"
        word = str(event.get("stopping_word") or "") if event.get("stop_type") == "word" else ""
        final = Chunk(
            done=True, done_reason=reason, stop_sequence=word,
            **timing_counts(event.get("timings")),
        )  # fmt: skip
        return [*piece, final]

    def finish(self) -> list[Chunk]:
        return []


def stop_sequences(options: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``stop`` option as a tuple of non-empty sequences."""
    stop = options.get("stop")
    words = [stop] if isinstance(stop, str) else list(stop or ())
    return tuple(str(w) for w in words if w)


@dataclass
class StopMatcher:
    """Stop sequences found in an answer's text as it streams: the text before the first
    match is sent, the match and what follows never are, and a tail that could still
    become a match is held back until the next piece says (as llama.cpp does)."""

    sequences: tuple[str, ...]
    matched: str = ""
    _held: str = ""
    # For each character, the beginnings of sequences that end with it, longest first: a
    # piece's tail is checked against only those (most pieces: none).
    _prefixes: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        prefixes = {s[:n] for s in self.sequences for n in range(1, len(s))}
        for prefix in sorted(prefixes, key=len, reverse=True):
            self._prefixes.setdefault(prefix[-1], []).append(prefix)

    def feed(self, piece: str) -> str:
        """The part of ``piece`` (after any held text) that may be sent now."""
        text = self._held + piece
        found = [(text.find(s), n, s) for n, s in enumerate(self.sequences) if s in text]
        if found:
            at, _, self.matched = min(found)
            self._held = ""
            return text[:at]
        keep = 0
        if text:
            keep = next((len(p) for p in self._prefixes.get(text[-1], ()) if text.endswith(p)), 0)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def flush(self) -> str:
        """The held tail, once the answer ended without a match."""
        held, self._held = self._held, ""
        return held


@dataclass
class _CallDeltas:
    """One tool call as its stream deltas have spelled it so far."""

    id: str = ""
    name: str = ""
    arguments: str = ""  # JSON text, in pieces


@dataclass
class ChatStream:
    """Parses ``/v1/chat/completions`` stream events; tool calls are joined from deltas.

    ``stop``: the request's stop sequences, matched in the answer's text here (the request
    to llama.cpp leaves them out, see :func:`chat_request`); at a match the stream is
    ``done`` at once, and its reader closes the runner stream, which stops llama.cpp."""

    done: bool = False
    top_logprobs: int = 0
    stop: tuple[str, ...] = ()
    forced_call: bool = False  # the answer is one call spelled as JSON (forced_call.py)
    _forced_text: str = ""
    _wrote_text: bool = False  # a malformed call's text then starts on a line of its own
    _finish_reason: str | None = None
    _timings: Mapping[str, Any] | None = None
    _calls: dict[int, _CallDeltas] = field(default_factory=dict)
    _matcher: StopMatcher | None = None

    def __post_init__(self) -> None:
        if self.stop:
            self._matcher = StopMatcher(self.stop)

    def feed(self, event: Mapping[str, Any]) -> list[Chunk]:
        raise_for_error(event)
        if self.done:
            return []
        if event.get("timings"):
            self._timings = event["timings"]
        chunks: list[Chunk] = []
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            content = delta.get("content") or ""
            if self.forced_call:  # held back: it is the call, not text
                self._forced_text += content
                content = ""
            if content and self._matcher is not None:
                content = self._matcher.feed(content)
            self._wrote_text = self._wrote_text or bool(content)
            thinking = delta.get("reasoning_content") or ""
            probabilities = (choice.get("logprobs") or {}).get("content")
            logprobs = ollama_logprobs(probabilities, self.top_logprobs)
            if content or thinking or logprobs:
                chunks.append(Chunk(content=content, thinking=thinking, logprobs=logprobs))
            if self._matcher is not None and self._matcher.matched:
                self._finish_reason = "stop"
                return chunks + self.finish()
            calls = [self._add_tool_delta(call) for call in delta.get("tool_calls") or ()]
            if calls:
                chunks.append(Chunk(tool_call_deltas=calls))
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return chunks

    def _add_tool_delta(self, delta: Mapping[str, Any]) -> ToolCallDelta:
        index = int(delta.get("index", len(self._calls)))
        call = self._calls.setdefault(index, _CallDeltas())
        call.id = delta.get("id") or call.id
        function = delta.get("function") or {}
        name, arguments = function.get("name") or "", function.get("arguments") or ""
        call.name += name
        call.arguments += arguments
        return ToolCallDelta(index, delta.get("id") or "", name, arguments)

    def finish(self) -> list[Chunk]:
        """The closing chunks, once the stream has ended (``[DONE]``)."""
        if self._finish_reason is None:
            return []
        self.done = True
        chunks = []
        matched = self._matcher.matched if self._matcher is not None else ""
        held = self._matcher.flush() if self._matcher is not None else ""
        if held:
            chunks.append(Chunk(content=held))
        calls = [_tool_call(self._calls[i]) for i in sorted(self._calls)]
        # Malformed calls come back as text (forced_call.py), counted on the final chunk.
        texts = [as_text(call) for call in calls if is_malformed(call)]
        if self.forced_call:
            call = forced_call(self._forced_text)
            calls.append(call) if call is not None else texts.append(self._forced_text)
        if texts:
            chunks.append(Chunk(content="\n" * (self._wrote_text or bool(held)) + "\n".join(texts)))
        if good := [call for call in calls if not is_malformed(call)]:
            chunks.append(Chunk(tool_calls=good))
        reason = "length" if self._finish_reason == "length" else "stop"
        chunks.append(Chunk(
            done=True, done_reason=reason, stop_sequence=matched, malformed_tool_calls=len(texts),
            **timing_counts(self._timings),
        ))  # fmt: skip
        return chunks


def _tool_call(call: _CallDeltas) -> ToolCall:
    """A joined call: arguments that are not a JSON object stay the text the model wrote."""
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments else {}
    except json.JSONDecodeError:
        arguments = call.arguments
    if not isinstance(arguments, Mapping | str):
        arguments = call.arguments
    return ToolCall(name=call.name, arguments=arguments, id=call.id)


def embedding_vectors(
    response: Mapping[str, Any], count: int, dimensions: int | None = None
) -> list[list[float]]:
    """Vectors from a ``/v1/embeddings`` response, in input order, L2-normalised
    (after truncation to ``dimensions``, as Ollama does)."""
    data = sorted(response.get("data") or (), key=lambda d: int(d.get("index", 0)))
    if len(data) != count:
        raise RunnerReportedError(f"runner returned {len(data)} embeddings for {count} inputs")
    return [normalise(d["embedding"][:dimensions] if dimensions else d["embedding"]) for d in data]


# Ollama's answer (400) when an embedding input does not fit and may not be truncated.
EMBED_INPUT_TOO_LONG = "the input length exceeds the context length"
# Ours, when a query and one document together do not fit the runner's batch.
RERANK_INPUT_TOO_LONG = "a query and document together exceed the context length"


def rerank_scores(response: Mapping[str, Any], count: int) -> list[float]:
    """Scores from a ``/v1/rerank`` response (asked for every document), in the order the
    documents were given."""
    scores: list[float | None] = [None] * count
    for result in response.get("results") or ():
        index = int(result.get("index", -1))
        if 0 <= index < count:
            scores[index] = float(result["relevance_score"])
    if any(score is None for score in scores):
        found = sum(score is not None for score in scores)
        raise RunnerReportedError(f"runner returned {found} scores for {count} documents")
    return [score for score in scores if score is not None]


def is_embedding_input_limit(message: str) -> bool:
    """Whether a runner's embedding error means the input was too long for its context or
    batch: Ollama's ``isEmbeddingInputLimitError``, which matches llama.cpp's texts."""
    text = message.lower()
    return any(
        marker in text
        for marker in (
            "too large", "context size", "context length", "physical batch size",
            "exceeds the available context",
        )
    )  # fmt: skip


def normalise(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return [float(x) / norm for x in vector] if norm > 0 else [float(x) for x in vector]
