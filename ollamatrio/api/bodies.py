"""Request bodies, whatever the dialect: reading JSON as Ollama does, typed field access,
and the checking and merging of Ollama's options.

Every helper raises :class:`~ollamatrio.errors.InvalidRequestError` (a 400) with a message
naming the field.  The dialects' translations (each dialect's ``wire.py``) build the
core's typed requests (:mod:`ollamatrio.generation.requests`) with them.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import AsyncIterable, Callable, Mapping
from typing import Any

from .. import speculative
from ..config import parse_keep_alive
from ..devices import cpu_count
from ..errors import InvalidRequestError, RequestTooLargeError
from ..kv_cache import KV_CACHE_TYPES, kv_type_name

log = logging.getLogger(__name__)

MAX_JSON_BODY = 64 << 20  # bytes; blob uploads are streamed and have no limit
# Containers inside containers.  Go allows 10000; Python's parser and everything after it
# recurse, so the limit leaves room below the interpreter's recursion limit (1000).
MAX_JSON_DEPTH = 256
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_NUM_CTX = 1 << 24

# Options with their JSON types (docs/api.md, Conventions).  Others are ignored, as Ollama does.
_INT, _FLOAT, _BOOL, _STRINGS = "integer", "float", "boolean", "array of strings"
_KV_TYPE = "KV cache type"
_SPECULATIVE = "speculative mode"  # a string, one of speculative.MODES
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
    # extension, load-time: the KV cache's type, both sides or one (ollamatrio/kv_cache.py)
    "kv_cache_type": _KV_TYPE, "kv_cache_type_k": _KV_TYPE, "kv_cache_type_v": _KV_TYPE,
    # extension (not in Ollama), load-time: speculative decoding (docs/speculative.md)
    speculative.OPTION: _SPECULATIVE,
}  # fmt: skip


def max_threads() -> int:
    """The largest ``num_thread``: more threads than this only slow a runner down (or, at
    absurd values, kill it)."""
    return cpu_count() * 4


# Inclusive ranges checked after the type (docs/api.md): values a runner would reject,
# die on, or read wrongly (llama.cpp keeps counts in 32-bit integers).  None: unbounded;
# a callable: decided on this machine.
OPTION_RANGES: Mapping[str, tuple[float | None, float | Callable[[], int] | None]] = {
    "num_ctx": (0, MAX_NUM_CTX),  # 0: automatic
    "num_batch": (0, MAX_NUM_CTX),  # 0: automatic
    "num_gpu": (-1, INT32_MAX),  # -1: as many layers as fit
    "main_gpu": (0, INT32_MAX),
    "num_thread": (0, max_threads),  # 0: the runtime decides
    "draft_num_predict": (0, INT32_MAX),
    "num_predict": (-2, INT32_MAX),  # -1: no limit, -2: fill the context
    "num_keep": (-1, INT32_MAX),  # -1: the whole prompt
    "seed": (INT64_MIN, INT64_MAX),  # -1: random
    "top_k": (0, INT32_MAX),  # 0: off
    "repeat_last_n": (-1, INT32_MAX),  # -1: the whole context
    "temperature": (0, None),
    "top_p": (0, 1),
    "min_p": (0, 1),
    "typical_p": (0, 1),
    "repeat_penalty": (0, None),
}
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
    value = loads(data)
    if not isinstance(value, dict):
        raise InvalidRequestError("request body must be a JSON object")
    return value


# A \u escape of a UTF-16 surrogate: the only way a lone surrogate gets into decoded text.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def loads(data: bytes | str) -> Any:
    """JSON from a client, decoded as Go's ``encoding/json`` decodes it for Ollama: invalid
    UTF-8 and lone surrogates become U+FFFD (text that reaches a runner or a response must
    be encodable), NaN, Infinity and numbers beyond float64 are refused, and so is nesting
    deeper than :data:`MAX_JSON_DEPTH` (Python's parser would recurse until it overflowed).
    Raises :class:`InvalidRequestError`."""
    text = data.decode("utf-8-sig", "replace") if isinstance(data, bytes) else data
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:
        raise InvalidRequestError(f"invalid JSON: {exc}") from None
    containers = text.count("[") + text.count("{")
    if containers > MAX_JSON_DEPTH or _SURROGATE_ESCAPE.search(text):
        root = [value]
        _repair(root)
        value = root[0]
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _too_deep() -> InvalidRequestError:
    return InvalidRequestError(f"invalid JSON: exceeded max depth ({MAX_JSON_DEPTH})")


def _fix(text: str) -> str:
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _repair(root: list[Any]) -> None:
    """Check the nesting and replace lone surrogates in place, without recursion (``root``
    holds the decoded value, which is at depth 1)."""
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        container, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        if isinstance(container, list):
            for i, item in enumerate(container):
                if isinstance(item, str):
                    container[i] = _fix(item)
                elif isinstance(item, list | dict):
                    stack.append((item, depth + 1))
        elif isinstance(container, dict):
            if any(_SURROGATE.search(key) for key in container):
                items = [(_fix(key), item) for key, item in container.items()]
                container.clear()
                container.update(items)
            for key, item in list(container.items()):
                if isinstance(item, str):
                    container[key] = _fix(item)
                elif isinstance(item, list | dict):
                    stack.append((item, depth + 1))


# -- field access ----------------------------------------------------------------------


def type_error(key: str, wanted: str) -> InvalidRequestError:
    return InvalidRequestError(f"invalid value for {key!r}: expected {wanted}")


def get_str(body: Mapping[str, Any], key: str, default: str = "") -> str:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise type_error(key, "a string")
    return value


def get_bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise type_error(key, "true or false")
    return value


def get_optional_bool(body: Mapping[str, Any], key: str) -> bool | None:
    """A boolean field whose absence (or null) means "the default", decided elsewhere."""
    return None if body.get(key) is None else get_bool(body, key, False)


def get_int(body: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise type_error(key, "an integer")
    if isinstance(value, float) and not value.is_integer():
        raise type_error(key, "an integer")
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidRequestError(f"invalid value for {key!r}: integer out of range")
    return int(value)


def get_list(body: Mapping[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise type_error(key, "a list")
    return value


def get_strings(body: Mapping[str, Any], key: str) -> tuple[str, ...]:
    items = get_list(body, key)
    if not all(isinstance(item, str) for item in items):
        raise type_error(key, "a list of strings")
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
    if value == "json":
        return "json"
    if isinstance(value, dict):
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


def check_option(key: str, value: Any, label: str | None = None) -> Any:
    """``value`` if it has the type ``key`` needs and lies in its range; JSON numbers may be
    integral floats.  Errors name ``label`` (default ``option <key>``)."""
    kind = OPTION_TYPES[key]
    label = label or f"option {key}"
    if value is None:
        return None
    if kind == _INT:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequestError(f"{label} must be of type integer")
        if isinstance(value, float) and not value.is_integer():
            raise InvalidRequestError(f"{label} must be of type integer")
        return _in_range(key, int(value), label)
    if kind == _FLOAT:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRequestError(f"{label} must be of type float")
        if not math.isfinite(value):  # a Modelfile's "nan"; JSON has none
            raise InvalidRequestError(f"{label} must be a finite number")
        return _in_range(key, float(value), label)
    if kind == _BOOL:
        if not isinstance(value, bool):
            raise InvalidRequestError(f"{label} must be of type boolean")
        return value
    if kind == _KV_TYPE:
        try:
            return kv_type_name(value if isinstance(value, str) else "")
        except ValueError:
            raise InvalidRequestError(
                f"{label} must be one of {', '.join(KV_CACHE_TYPES)}"
            ) from None
    if kind == _SPECULATIVE:
        try:
            return speculative.parse_mode(value)
        except speculative.SpeculativeError as exc:
            raise InvalidRequestError(str(exc)) from None
    if isinstance(value, str):  # a single stop string, as Modelfiles write it
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequestError(f"{label} must be of type {_STRINGS}")
    return list(value)


def _in_range(key: str, value: float, label: str) -> Any:
    low, high = OPTION_RANGES.get(key, (None, None))
    if callable(high):
        high = high()
    if (low is None or value >= low) and (high is None or value <= high):
        return value

    def show(bound: float) -> str:
        return f"{bound:g}" if isinstance(bound, float) else str(bound)

    if high is None:
        assert low is not None
        raise InvalidRequestError(f"{label} must be at least {show(low)}")
    if low is None:
        raise InvalidRequestError(f"{label} must be at most {show(high)}")
    raise InvalidRequestError(f"{label} must be between {show(low)} and {show(high)}")


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


def get_objects(body: Mapping[str, Any], key: str) -> tuple[Mapping[str, Any], ...]:
    """A list of JSON objects (``tools``), passed on as they came."""
    items = get_list(body, key)
    if not all(isinstance(item, dict) for item in items):
        raise type_error(key, "a list of objects")
    return tuple(items)


def get_options(body: Mapping[str, Any]) -> Mapping[str, Any]:
    value = body.get("options")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequestError("options must be an object")
    merge_options(value)  # type errors now, before anything is loaded
    return value
