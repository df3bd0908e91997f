"""Request bodies of the native API: reading, validation, and option merging.

Every parser takes the decoded JSON object and returns a frozen record, or raises
:class:`~ollamatrio.errors.InvalidRequestError` (a 400) with a message naming the field.
The ``/v1`` layer builds the same records from OpenAI bodies.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import parse_keep_alive
from ..errors import InvalidRequestError
from .errors import RequestTooLargeError

log = logging.getLogger(__name__)

MAX_JSON_BODY = 64 << 20  # bytes; blob uploads are streamed and have no limit

# Options with their JSON types (spec §2).  Others are ignored, as Ollama does.
_INT, _FLOAT, _BOOL, _STRINGS = "integer", "float", "boolean", "array of strings"
OPTION_TYPES: Mapping[str, str] = {
    # load-time
    "num_ctx": _INT, "num_batch": _INT, "num_gpu": _INT, "main_gpu": _INT,
    "use_mmap": _BOOL, "num_thread": _INT, "draft_num_predict": _INT,
    # sampling
    "num_predict": _INT, "num_keep": _INT, "seed": _INT, "temperature": _FLOAT,
    "top_k": _INT, "top_p": _FLOAT, "min_p": _FLOAT, "typical_p": _FLOAT,
    "repeat_last_n": _INT, "repeat_penalty": _FLOAT, "presence_penalty": _FLOAT,
    "frequency_penalty": _FLOAT, "stop": _STRINGS,
    # extension (not in Ollama): never stop at end-of-generation tokens (benchmarks)
    "ignore_eos": _BOOL,
}  # fmt: skip
# Sent by older clients (ollama-python's Options model among them): accepted, dropped.
IGNORED_OPTIONS = frozenset(
    {
        "numa", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mlock",
        "embedding_only", "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta",
        "penalize_newline",
    }
)  # fmt: skip
THINK_LEVELS = ("low", "medium", "high", "max")


async def read_json(body: AsyncIterable[bytes], limit: int = MAX_JSON_BODY) -> dict[str, Any]:
    """Read a JSON object from a request body, refusing more than ``limit`` bytes."""
    data = bytearray()
    async for chunk in body:
        data += chunk
        if len(data) > limit:
            raise RequestTooLargeError(f"request body exceeds {limit} bytes")
    return decode_json_object(bytes(data))


def decode_json_object(data: bytes) -> dict[str, Any]:
    if not data.strip():
        raise InvalidRequestError("missing request body")
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequestError("request body must be a JSON object")
    return value


# -- field access ----------------------------------------------------------------------


def _type_error(key: str, wanted: str) -> InvalidRequestError:
    return InvalidRequestError(f"invalid value for {key!r}: expected {wanted}")


def get_str(body: Mapping[str, Any], key: str, default: str = "") -> str:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _type_error(key, "a string")
    return value


def get_bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(key, "true or false")
    return value


def get_int(body: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(key, "an integer")
    if isinstance(value, float) and not value.is_integer():
        raise _type_error(key, "an integer")
    return int(value)


def get_list(body: Mapping[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _type_error(key, "a list")
    return value


def get_strings(body: Mapping[str, Any], key: str) -> tuple[str, ...]:
    items = get_list(body, key)
    if not all(isinstance(item, str) for item in items):
        raise _type_error(key, "a list of strings")
    return tuple(items)


def get_model(body: Mapping[str, Any]) -> str:
    """``model`` (or the legacy ``name``); required."""
    model = get_str(body, "model") or get_str(body, "name")
    if not model:
        raise InvalidRequestError("model is required")
    return model


def get_stream(body: Mapping[str, Any]) -> bool:
    """Streaming is on unless ``stream`` is explicitly false."""
    return get_bool(body, "stream", True)


def get_keep_alive(body: Mapping[str, Any]) -> float | None:
    return parse_keep_alive(body.get("keep_alive"))


def get_format(body: Mapping[str, Any]) -> str | dict[str, Any] | None:
    value = body.get("format")
    if value is None or value == "":
        return None
    if value == "json" or isinstance(value, dict):
        return value
    raise InvalidRequestError('invalid format: expected "json" or a valid JSON schema')


def get_think(body: Mapping[str, Any]) -> bool | str | None:
    value = body.get("think")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value in THINK_LEVELS:
        return value
    raise InvalidRequestError(
        f"invalid think value: {json.dumps(value)} (must be true, false, "
        + ", ".join(f'"{level}"' for level in THINK_LEVELS)
        + ")"
    )


def get_top_logprobs(body: Mapping[str, Any]) -> int:
    value = get_int(body, "top_logprobs", 0) or 0
    if not 0 <= value <= 20:
        raise InvalidRequestError("top_logprobs must be between 0 and 20")
    return value


# -- options ---------------------------------------------------------------------------


def check_option(key: str, value: Any) -> Any:
    """``value`` if it has the type ``key`` needs; JSON numbers may be integral floats."""
    kind = OPTION_TYPES[key]
    if value is None:
        return None
    if kind == _INT:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequestError(f"option {key} must be of type integer")
        if isinstance(value, float) and not value.is_integer():
            raise InvalidRequestError(f"option {key} must be of type integer")
        return int(value)
    if kind == _FLOAT:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequestError(f"option {key} must be of type float")
        return float(value)
    if kind == _BOOL:
        if not isinstance(value, bool):
            raise InvalidRequestError(f"option {key} must be of type boolean")
        return value
    if isinstance(value, str):  # a single stop string, as Modelfiles write it
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequestError(f"option {key} must be of type {_STRINGS}")
    return list(value)


def merge_options(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Model parameters, then request options: later layers win; types are checked;
    unknown keys are dropped with a warning (old clients send options we don't have)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        if layer is None:
            continue
        if not isinstance(layer, Mapping):
            raise InvalidRequestError("options must be an object")
        for key, value in layer.items():
            if key in OPTION_TYPES:
                checked = check_option(key, value)
                if checked is None:
                    merged.pop(key, None)
                else:
                    merged[key] = checked
            elif key not in IGNORED_OPTIONS:
                log.warning("ignoring unknown option %r", key)
    return merged


def get_options(body: Mapping[str, Any]) -> Mapping[str, Any]:
    value = body.get("options")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequestError("options must be an object")
    merge_options(value)  # type errors now, before anything is loaded
    return value


# -- request records -------------------------------------------------------------------


@dataclass(frozen=True)
class GenerateRequest:
    model: str
    prompt: str = ""
    suffix: str = ""
    system: str = ""
    template: str = ""
    context: tuple[int, ...] = ()
    raw: bool = False
    format: str | dict[str, Any] | None = None
    images: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    keep_alive: float | None = None
    think: bool | str | None = None
    stream: bool = True
    logprobs: bool = False
    top_logprobs: int = 0

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> GenerateRequest:
        context = get_list(body, "context")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in context):
            raise _type_error("context", "a list of integers")
        req = cls(
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
        )
        if req.raw and (req.template or req.system or req.context):
            raise InvalidRequestError("raw mode does not support template, system, or context")
        return req


_MESSAGE_STR_FIELDS = ("content", "thinking", "tool_name", "tool_call_id")


def parse_message(message: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _type_error(where, "an object")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidRequestError(f"{where}: role is required")
    out = dict(message)
    for key in _MESSAGE_STR_FIELDS:
        if key in out and out[key] is not None and not isinstance(out[key], str):
            raise _type_error(f"{where}.{key}", "a string")
    out["content"] = out.get("content") or ""
    get_strings(out, "images")
    get_list(out, "tool_calls")
    return out


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[dict[str, Any], ...] = ()
    tools: tuple[dict[str, Any], ...] = ()
    format: str | dict[str, Any] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    keep_alive: float | None = None
    think: bool | str | None = None
    stream: bool = True
    logprobs: bool = False
    top_logprobs: int = 0

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> ChatRequest:
        tools = get_list(body, "tools")
        if not all(isinstance(t, dict) for t in tools):
            raise _type_error("tools", "a list of objects")
        return cls(
            model=get_model(body),
            messages=tuple(parse_message(m, i) for i, m in enumerate(get_list(body, "messages"))),
            tools=tuple(tools),
            format=get_format(body),
            options=get_options(body),
            keep_alive=get_keep_alive(body),
            think=get_think(body),
            stream=get_stream(body),
            logprobs=get_bool(body, "logprobs", False),
            top_logprobs=get_top_logprobs(body),
        )

    @property
    def images(self) -> bool:
        return any(m.get("images") for m in self.messages)


@dataclass(frozen=True)
class EmbedRequest:
    model: str
    inputs: tuple[str, ...] = ()
    truncate: bool = True
    dimensions: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    keep_alive: float | None = None

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> EmbedRequest:
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
        return cls(
            model=get_model(body),
            inputs=inputs,
            truncate=get_bool(body, "truncate", True),
            dimensions=dimensions,
            options=get_options(body),
            keep_alive=get_keep_alive(body),
        )


@dataclass(frozen=True)
class EmbeddingsRequest:
    """The legacy ``/api/embeddings`` body."""

    model: str
    prompt: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    keep_alive: float | None = None

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> EmbeddingsRequest:
        return cls(
            model=get_model(body),
            prompt=get_str(body, "prompt"),
            options=get_options(body),
            keep_alive=get_keep_alive(body),
        )
