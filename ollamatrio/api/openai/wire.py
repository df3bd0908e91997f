"""The OpenAI dialect's translations: ``/v1`` bodies to the core's typed requests, and the
core's folded answers to OpenAI objects.

Bodies are read straight into :mod:`ollamatrio.generation.requests` records (checked with
the helpers of :mod:`.requests`, with the errors Ollama's ``openai`` package gives); answers
come from :class:`~ollamatrio.generation.answer.Answer`.  The streamed events are written by
:mod:`.stream`.  Everything here is pure: no I/O, no scheduler.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from ... import speculative
from ...errors import InvalidRequestError
from ...generation.answer import Answer
from ...generation.relay import Timings
from ...generation.requests import (
    ChatRequest,
    EmbedRequest,
    Format,
    GenerateRequest,
    Message,
    Think,
    ToolCall,
)
from ...wire import json_bytes
from ..bodies import (
    check_option,
    get_bool,
    get_int,
    get_keep_alive,
    get_list,
    get_model,
    get_objects,
    get_str,
    get_top_logprobs,
    loads,
    merge_options,
)
from ..tool_choice import openai_tool_choice

SYSTEM_FINGERPRINT = "fp_ollama"

# OpenAI's reasoning efforts as the core's ``think`` values (THINK_LEVELS).
REASONING_EFFORTS: Mapping[str, bool | str] = {
    "none": False,
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "max",
    "max": "max",
}
# Image data URLs accepted in ``image_url`` parts; a bare "data:;base64," as Ollama allows.
_IMAGE_PREFIXES = (
    *(f"data:image/{kind};base64," for kind in ("jpeg", "jpg", "png", "webp")),
    "data:;base64,",
)
# OpenAI sampling fields that are Ollama options under the same name.
_SAMPLING_FIELDS = ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty")
ENCODING_FORMATS = ("float", "base64")


# -- errors ----------------------------------------------------------------------------


def error_type(status: int) -> str:
    return {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")


def error_object(message: str, status: int) -> dict[str, Any]:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": error_type(status), "param": None, "code": None}}


# -- requests --------------------------------------------------------------------------

R = TypeVar("R", GenerateRequest, ChatRequest, EmbedRequest)


@dataclass(frozen=True)
class OpenAiRequest(Generic[R]):
    """A translated ``/v1`` body: the core's request, and the little that only this
    dialect's answer needs."""

    core: R
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the counts
    encoding_format: str = "float"  # /v1/embeddings: "float" or "base64"


def chat_request(body: Mapping[str, Any]) -> OpenAiRequest[ChatRequest]:
    """A ``/v1/chat/completions`` body."""
    messages = get_list(body, "messages")
    if not messages:
        raise InvalidRequestError("[] is too short - 'messages'")
    _check_n(body)
    model = get_model(body)
    typed = chat_messages(messages)
    options = sampling_options(body)
    stream = get_bool(body, "stream", False)
    keep_alive = get_keep_alive(body)
    fmt = response_format(body.get("response_format"))
    think = reasoning(body)
    tools, choice = openai_tool_choice(get_objects(body, "tools"), body.get("tool_choice"))
    logprobs = get_bool(body, "logprobs", False)
    core = ChatRequest(
        model=model,
        messages=typed,
        tools=tools,
        tool_choice=choice,
        format=fmt,
        options=options,
        keep_alive=keep_alive,
        think=think,
        stream=stream,
        logprobs=logprobs,
        top_logprobs=get_top_logprobs(body) if logprobs else 0,
    )
    return OpenAiRequest(core, include_usage=include_usage(body))


def completion_request(body: Mapping[str, Any]) -> OpenAiRequest[GenerateRequest]:
    """A ``/v1/completions`` body."""
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise InvalidRequestError("invalid prompt: only a single string is supported")
    _check_n(body)
    model = get_model(body)
    options = sampling_options(body)
    stream = get_bool(body, "stream", False)
    keep_alive = get_keep_alive(body)
    suffix = get_str(body, "suffix")
    # The legacy field is a count: that many alternatives per token (Ollama's reading).
    top = get_int(body, "logprobs", 0) or 0
    if top > 20:
        raise InvalidRequestError("top_logprobs must be between 0 and 20")
    core = GenerateRequest(
        model=model,
        prompt=prompt,
        suffix=suffix,
        options=options,
        keep_alive=keep_alive,
        stream=stream,
        logprobs=top > 0,
        top_logprobs=max(top, 0),
    )
    return OpenAiRequest(core, include_usage=include_usage(body))


def embedding_request(body: Mapping[str, Any]) -> OpenAiRequest[EmbedRequest]:
    """A ``/v1/embeddings`` body: ``input`` is a string or a list of strings (token arrays
    are not supported)."""
    model = get_model(body)
    inputs = embedding_inputs(body)
    fmt = encoding_format(body)
    core = EmbedRequest(model=model, inputs=inputs, dimensions=dimensions(body))
    return OpenAiRequest(core, encoding_format=fmt)


def include_usage(body: Mapping[str, Any]) -> bool:
    """``stream_options.include_usage``: a final chunk with the token counts."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise InvalidRequestError("invalid value for 'stream_options': expected an object")
    return get_bool(options, "include_usage", False)


def _check_n(body: Mapping[str, Any]) -> None:
    if get_int(body, "n", 1) != 1:
        raise InvalidRequestError("only n=1 is supported")


def sampling_options(body: Mapping[str, Any]) -> dict[str, Any]:
    """Ollama options from OpenAI's sampling fields, checked as the options they become
    (errors name the OpenAI field).  Unlike the native API, temperature and top_p default
    to 1.0 (OpenAI's defaults) and so override model parameters.  Ollama ``options`` sent
    as an extra body field (the SDKs' ``extra_body``) apply too; an OpenAI field that is
    also given wins over them."""
    extra = body.get("options")
    if extra is not None and not isinstance(extra, dict):
        raise InvalidRequestError("invalid value for 'options': expected an object")
    options: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, **(extra or {})}
    for key in (*_SAMPLING_FIELDS, speculative.OPTION):  # ours too, as an extra field
        if body.get(key) is not None:
            options[key] = check_option(key, body[key], key)
    for key in ("max_completion_tokens", "max_tokens"):
        if body.get(key) is not None:
            options["num_predict"] = check_option("num_predict", body[key], key)
            break
    stop = body.get("stop")
    if isinstance(stop, str):
        options["stop"] = [stop]
    elif isinstance(stop, list):
        if not all(isinstance(s, str) for s in stop):
            raise InvalidRequestError("invalid type for 'stop' field: expected strings")
        options["stop"] = stop
    elif stop is not None:
        raise InvalidRequestError("invalid type for 'stop' field: expected a string or a list")
    merge_options(options)  # the extra options' types, before anything is loaded
    return options


def response_format(value: Any) -> Format:
    """``json_object`` becomes format "json", ``json_schema`` its schema, ``text`` nothing."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequestError("invalid value for 'response_format': expected an object")
    kind = str(value.get("type") or "").strip().lower()
    if kind in ("", "text"):
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            return None  # a schema-less json_schema constrains nothing, as in Ollama
        if not isinstance(schema, dict):
            raise InvalidRequestError("response_format.json_schema.schema must be an object")
        return schema
    raise InvalidRequestError(f"invalid response_format type: {kind!r}")


def reasoning(body: Mapping[str, Any]) -> Think:
    """``reasoning.effort`` (or ``reasoning_effort``) as the core's ``think``."""
    effort: Any = None
    nested = body.get("reasoning")
    if isinstance(nested, dict):
        effort = nested.get("effort")
    if effort is None:
        effort = body.get("reasoning_effort")
    if effort is None:
        return None
    if not isinstance(effort, str) or effort not in REASONING_EFFORTS:
        allowed = ", ".join(f'"{e}"' for e in REASONING_EFFORTS)
        raise InvalidRequestError(
            f"invalid reasoning value: {json.dumps(effort)} (must be {allowed})"
        )
    return REASONING_EFFORTS[effort]


def chat_messages(messages: Sequence[Any]) -> tuple[Message, ...]:
    """OpenAI messages as the core's: content parts are joined (text) and collected
    (images), tool calls get object arguments, tool results the name of their call, and
    ``developer`` is a system message."""
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError(f"invalid value for 'messages[{index}]': expected an object")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequestError(f"messages[{index}]: role is required")
        content = message.get("content")
        calls = message.get("tool_calls")
        images: tuple[str, ...] = ()
        if isinstance(content, str):
            text = content
        elif isinstance(content, list):
            text, images = content_parts(content)
        elif content is None and calls:
            text = ""  # content is optional only beside tool calls
        else:
            kind = "null" if content is None else type(content).__name__
            raise InvalidRequestError(f"invalid message content type: {kind}")
        thinking = message.get("reasoning") or message.get("reasoning_content")
        tool_name = tool_call_id = ""
        if role == "tool":
            call_id = message.get("tool_call_id")
            name = message.get("name") or _tool_name(messages, call_id)
            tool_name = name if isinstance(name, str) else ""
            tool_call_id = call_id if isinstance(call_id, str) else ""
        out.append(
            Message(
                role="system" if role == "developer" else role,
                content=text,
                thinking=thinking if isinstance(thinking, str) else "",
                images=images,
                tool_calls=tool_calls(calls) if calls else (),
                tool_name=tool_name,
                tool_call_id=tool_call_id,
            )
        )
    return tuple(out)


def content_parts(parts: Sequence[Any]) -> tuple[str, tuple[str, ...]]:
    """(text, base64 images) of a content-part list."""
    texts: list[str] = []
    images: list[str] = []
    for part in parts:
        if not isinstance(part, dict):
            raise InvalidRequestError("invalid message format")
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequestError("invalid message format")
            texts.append(text)
        elif kind == "image_url":
            url = part.get("image_url")
            if isinstance(url, dict):
                url = url.get("url")
            if not isinstance(url, str):
                raise InvalidRequestError("invalid message format")
            images.append(decode_image_url(url))
        else:
            raise InvalidRequestError(f"unsupported content part type: {json.dumps(kind)}")
    return "\n".join(texts), tuple(images)


def decode_image_url(url: str) -> str:
    """The base64 payload of an image data URL (remote URLs are not fetched)."""
    for prefix in _IMAGE_PREFIXES:
        if url.startswith(prefix):
            data = url[len(prefix) :]
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidRequestError("invalid image input") from None
            return data
    raise InvalidRequestError("invalid image input")


def tool_calls(calls: Any) -> tuple[ToolCall, ...]:
    """OpenAI tool calls (arguments as a JSON string) as the core's (an object)."""
    if not isinstance(calls, list):
        raise InvalidRequestError("invalid value for 'tool_calls': expected a list")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequestError("invalid tool call: function.name is required")
        arguments = call_arguments(function.get("arguments"), "invalid tool call arguments")
        call_id = call.get("id")
        out.append(
            ToolCall(
                name=function["name"],
                arguments=arguments,
                id=call_id if isinstance(call_id, str) else "",
            )
        )
    return tuple(out)


def call_arguments(value: Any, error: str) -> dict[str, Any]:
    """A function call's arguments, an object or OpenAI's JSON string of one; ``error`` (a
    400) for anything else."""
    arguments = value or "{}"
    if isinstance(arguments, str):
        try:
            arguments = loads(arguments)
        except InvalidRequestError:
            raise InvalidRequestError(error) from None
    if not isinstance(arguments, dict):
        raise InvalidRequestError(error)
    return arguments


def _tool_name(messages: Sequence[Any], call_id: Any) -> str:
    """The function name of the (latest) assistant tool call with ``call_id``."""
    if not isinstance(call_id, str) or not call_id:
        return ""
    for message in reversed(messages):
        for call in (message.get("tool_calls") or ()) if isinstance(message, dict) else ():
            if isinstance(call, dict) and call.get("id") == call_id:
                function = call.get("function") or {}
                return str(function.get("name") or "")
    return ""


def embedding_inputs(body: Mapping[str, Any]) -> tuple[str, ...]:
    """``input`` as strings; token arrays are not supported."""
    raw = body.get("input")
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list) and raw and all(isinstance(item, str) for item in raw):
        return tuple(raw)
    raise InvalidRequestError("invalid input")


def encoding_format(body: Mapping[str, Any]) -> str:
    value = body.get("encoding_format")
    if value is None or value == "":
        return "float"
    if isinstance(value, str) and value.lower() in ENCODING_FORMATS:
        return value.lower()
    raise InvalidRequestError(
        f"Invalid value for 'encoding_format' = {value}. Supported values: ['float', 'base64']."
    )


def dimensions(body: Mapping[str, Any]) -> int | None:
    value = get_int(body, "dimensions")
    if value is not None and value <= 0:
        raise InvalidRequestError("dimensions must be a positive integer")
    return value


# -- responses -------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.randbelow(1_000_000)}"


def usage(timings: Timings) -> dict[str, Any]:
    """The token counts of a finished generation."""
    return usage_counts(
        timings.prompt_eval_count, timings.eval_count, timings.prompt_cached_count,
        timings.draft_count, timings.draft_accepted_count,
    )  # fmt: skip


def usage_counts(
    prompt: int,
    completion: int,
    cached: int,
    drafted: int | None = None,
    accepted: int | None = None,
) -> dict[str, Any]:
    """OpenAI's usage: ``prompt_tokens`` is the whole prompt, the part reused from the
    runner's cache in ``prompt_tokens_details.cached_tokens``.  From a runner that drafts
    (speculative decoding), ``completion_tokens_details`` adds ours: ``draft_count`` tokens
    drafted and ``draft_accepted_count`` of them kept (the kept ones are among
    ``completion_tokens``; the others cost a verification, not a token of the answer)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if drafted is not None:
        out["completion_tokens_details"] = {
            "draft_count": drafted,
            "draft_accepted_count": accepted or 0,
        }
    return out


def openai_tool_calls(
    calls: Sequence[ToolCall], first: int = 0, *, stream: bool = False
) -> list[dict[str, Any]]:
    """Tool calls in OpenAI's shape: an id, and arguments as a JSON string.  Stream deltas
    also carry the call's ``index`` within the response."""
    out = []
    for n, call in enumerate(calls):
        arguments = call.arguments
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
        item: dict[str, Any] = {"id": call.id or f"call_{secrets.token_hex(4)}"}
        if stream:
            item["index"] = first + n
        item["type"] = "function"
        item["function"] = {"name": call.name, "arguments": arguments}
        out.append(item)
    return out


def _finish_reason(answer: Answer) -> str:
    return "tool_calls" if answer.tool_calls else answer.done_reason


def chat_completion(model: str, answer: Answer) -> dict[str, Any]:
    """A ``chat.completion`` from the folded answer."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.thinking:
        message["reasoning"] = answer.thinking
    if answer.tool_calls:
        message["tool_calls"] = openai_tool_calls(answer.tool_calls)
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _finish_reason(answer),
                **_choice_logprobs(answer),
            }
        ],
        "usage": usage(answer.timings),
    }


def _choice_logprobs(answer: Answer) -> dict[str, Any]:
    """A choice's ``logprobs`` (``{"content": [...]}``), when the answer has some."""
    if not answer.logprobs:
        return {}
    return {"logprobs": {"content": [dict(p) for p in answer.logprobs]}}


def text_completion(model: str, answer: Answer) -> dict[str, Any]:
    """A ``text_completion`` from the folded answer."""
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [
            {
                "text": answer.content,
                "index": 0,
                "finish_reason": answer.done_reason,
                "logprobs": None,
                **_choice_logprobs(answer),
            }
        ],
        "usage": usage(answer.timings),
    }


def unloaded_completion(model: str) -> dict[str, Any]:
    """The answer to an empty prompt with ``keep_alive: 0`` (an unload): Ollama's
    ``done_reason`` as the finish reason, as its middleware passes it on, and no text."""
    answer = Answer("", "", (), (), "unload", "", (), Timings(0, 0, 0, 0, 0, 0))
    return text_completion(model, answer)


def sse_event(obj: Any) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


def embedding_list(
    model: str, vectors: Sequence[Sequence[float]], prompt_tokens: int, fmt: str
) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "embedding": floats_base64(vector) if fmt == "base64" else list(vector),
                "index": index,
            }
            for index, vector in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def floats_base64(vector: Sequence[float]) -> str:
    """Little-endian float32, base64-encoded (OpenAI's ``encoding_format: base64``)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def model_object(name: str, modified_at: datetime, owned_by: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": int(modified_at.timestamp()),
        "owned_by": owned_by,
    }
