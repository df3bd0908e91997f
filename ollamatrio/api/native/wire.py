"""The native dialect's translations: Ollama's ``/api`` bodies to the core's typed requests,
and the core's folded answers to Ollama's objects.

Pure: no I/O, no scheduler.  A body that does not check out raises
:class:`~ollamatrio.errors.InvalidRequestError` (a 400) naming the field, with Ollama's
messages.  The streamed lines are written by :mod:`.stream`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import InvalidRequestError
from ...generation.answer import Answer
from ...generation.relay import Timings
from ...generation.requests import ChatRequest, EmbedRequest, GenerateRequest, Message, ToolCall
from ...wire import ns, rfc3339
from ..bodies import (
    get_bool,
    get_format,
    get_int,
    get_keep_alive,
    get_list,
    get_model,
    get_objects,
    get_optional_bool,
    get_options,
    get_str,
    get_stream,
    get_strings,
    get_think,
    get_top_logprobs,
    type_error,
)
from ..pipeline import Embedded

# -- requests --------------------------------------------------------------------------


def generate_request(body: Mapping[str, Any]) -> GenerateRequest:
    """An ``/api/generate`` body."""
    context = get_list(body, "context")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in context):
        raise type_error("context", "a list of integers")
    req = GenerateRequest(
        model=get_model(body),
        prompt=get_str(body, "prompt"),
        suffix=get_str(body, "suffix"),
        system=get_str(body, "system"),
        template=get_str(body, "template"),
        context=tuple(context),
        raw=get_bool(body, "raw", False),
        format=get_format(body),
        images=get_strings(body, "images"),
        options=get_options(body),
        keep_alive=get_keep_alive(body),
        think=get_think(body),
        stream=get_stream(body),
        logprobs=get_bool(body, "logprobs", False),
        top_logprobs=get_top_logprobs(body),
        shift=get_optional_bool(body, "shift"),
        truncate=get_bool(body, "truncate", True),
    )
    if req.raw and (req.template or req.system or req.context):
        raise InvalidRequestError("raw mode does not support template, system, or context")
    return req


def chat_request(body: Mapping[str, Any]) -> ChatRequest:
    """An ``/api/chat`` body."""
    tools = get_objects(body, "tools")
    return ChatRequest(
        model=get_model(body),
        messages=tuple(message(m, i) for i, m in enumerate(get_list(body, "messages"))),
        tools=tools,
        format=get_format(body),
        options=get_options(body),
        keep_alive=get_keep_alive(body),
        think=get_think(body),
        stream=get_stream(body),
        logprobs=get_bool(body, "logprobs", False),
        top_logprobs=get_top_logprobs(body),
        shift=get_optional_bool(body, "shift"),
        truncate=get_bool(body, "truncate", True),
    )


_MESSAGE_STR_FIELDS = ("content", "thinking", "tool_name", "tool_call_id")


def message(value: Any, index: int) -> Message:
    """``messages[index]``: Ollama's ``api.Message``; other fields are ignored."""
    where = f"messages[{index}]"
    if not isinstance(value, dict):
        raise type_error(where, "an object")
    role = value.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidRequestError(f"{where}: role is required")
    for key in _MESSAGE_STR_FIELDS:
        if value.get(key) is not None and not isinstance(value[key], str):
            raise type_error(f"{where}.{key}", "a string")
    calls = get_list(value, "tool_calls")
    return Message(
        role=role,
        content=value.get("content") or "",
        thinking=value.get("thinking") or "",
        images=get_strings(value, "images"),
        tool_calls=tuple(tool_call(c, f"{where}.tool_calls[{n}]") for n, c in enumerate(calls)),
        tool_name=value.get("tool_name") or "",
        tool_call_id=value.get("tool_call_id") or "",
    )


def tool_call(value: Any, where: str) -> ToolCall:
    """An earlier tool call in a message: ``{"id"?, "function": {"index"?, "name",
    "arguments"}}``.  Arguments are an object (a string is passed on as written)."""
    if not isinstance(value, dict):
        raise type_error(where, "an object")
    function = value.get("function")
    if function is None:
        function = {}
    elif not isinstance(function, dict):
        raise type_error(f"{where}.function", "an object")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = {}
    elif not isinstance(arguments, dict | str):
        raise type_error(f"{where}.function.arguments", "an object")
    name, call_id = function.get("name"), value.get("id")
    if name is not None and not isinstance(name, str):
        raise type_error(f"{where}.function.name", "a string")
    if call_id is not None and not isinstance(call_id, str):
        raise type_error(f"{where}.id", "a string")
    return ToolCall(
        name=name or "",
        arguments=arguments,
        id=call_id or "",
        index=get_int(function, "index", 0) or 0,
    )


def embed_request(body: Mapping[str, Any]) -> EmbedRequest:
    """An ``/api/embed`` body: ``input`` is a string or a list of strings."""
    raw = body.get("input")
    if raw is None or raw == "":
        inputs: tuple[str, ...] = ()
    elif isinstance(raw, str):
        inputs = (raw,)
    elif isinstance(raw, list) and all(isinstance(item, str) for item in raw):
        inputs = tuple(raw)
    else:
        raise InvalidRequestError("invalid input type")
    dimensions = get_int(body, "dimensions")
    if dimensions is not None and dimensions <= 0:
        raise InvalidRequestError("dimensions must be a positive integer")
    return EmbedRequest(
        model=get_model(body),
        inputs=inputs,
        truncate=get_bool(body, "truncate", True),
        dimensions=dimensions,
        options=get_options(body),
        keep_alive=get_keep_alive(body),
    )


def embeddings_request(body: Mapping[str, Any]) -> EmbedRequest:
    """The legacy ``/api/embeddings`` body: one ``prompt`` (empty: load only)."""
    prompt = get_str(body, "prompt")
    return EmbedRequest(
        model=get_model(body),
        inputs=(prompt,) if prompt else (),
        options=get_options(body),
        keep_alive=get_keep_alive(body),
    )


# -- answers ---------------------------------------------------------------------------


def timings(t: Timings) -> dict[str, int]:
    """The counts and durations of a final object, in Ollama's order, then ours:
    ``prompt_cached_count``, the part of ``prompt_eval_count`` reused from the runner's
    cache (``prompt_eval_duration`` covers only the rest); and from a runner that drafts
    (speculative decoding), ``draft_count`` tokens drafted and ``draft_accepted_count`` of
    them kept by the model."""
    out = {
        "total_duration": t.total_duration,
        "load_duration": t.load_duration,
        "prompt_eval_count": t.prompt_eval_count,
        "prompt_eval_duration": t.prompt_eval_duration,
        "eval_count": t.eval_count,
        "eval_duration": t.eval_duration,
        "prompt_cached_count": t.prompt_cached_count,
    }
    if t.draft_count is not None:
        out["draft_count"] = t.draft_count
        out["draft_accepted_count"] = t.draft_accepted_count or 0
    return out


def _final(answer: Answer) -> dict[str, Any]:
    out: dict[str, Any] = {"done": True, "done_reason": answer.done_reason}
    if answer.context:
        out["context"] = list(answer.context)
    out.update(timings(answer.timings))
    if answer.logprobs:
        out["logprobs"] = [dict(p) for p in answer.logprobs]
    return out


def generate_answer(model: str, answer: Answer) -> dict[str, Any]:
    """The one ``/api/generate`` object of ``"stream": false``."""
    out: dict[str, Any] = {"model": model, "created_at": rfc3339(), "response": answer.content}
    if answer.thinking:
        out["thinking"] = answer.thinking
    out.update(_final(answer))
    return out


def chat_answer(model: str, answer: Answer) -> dict[str, Any]:
    """The one ``/api/chat`` object of ``"stream": false``."""
    reply: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.thinking:
        reply["thinking"] = answer.thinking
    if answer.tool_calls:
        reply["tool_calls"] = [call.to_ollama() for call in answer.tool_calls]
    out: dict[str, Any] = {"model": model, "created_at": rfc3339(), "message": reply}
    out.update(_final(answer))
    return out


def done_object(req: GenerateRequest | ChatRequest, reason: str) -> dict[str, Any]:
    """The answer to a request that only loads (``"load"``) or unloads (``"unload"``) its
    model: no text, no counts."""
    out: dict[str, Any] = {"model": req.model, "created_at": rfc3339()}
    if isinstance(req, GenerateRequest):
        out["response"] = ""
    else:
        out["message"] = {"role": "assistant", "content": ""}
    out.update(done=True, done_reason=reason)
    return out


def embed_answer(model: str, done: Embedded) -> dict[str, Any]:
    """The ``/api/embed`` object; a load-only request (no input) gets only the model and no
    embeddings, as Ollama answers it."""
    if not done.vectors:
        return {"model": model, "embeddings": []}
    return {
        "model": model,
        "embeddings": done.vectors,
        "total_duration": ns(done.total_duration),
        "load_duration": ns(done.load_duration),
        "prompt_eval_count": done.prompt_eval_count,
    }


def embeddings_answer(done: Embedded) -> dict[str, Any]:
    """The legacy ``/api/embeddings`` object: the one vector (empty when only loading)."""
    return {"embedding": done.vectors[0] if done.vectors else []}
