"""Python values seen as Go sees them in a template: truth, printing (``fmt.Sprint``, with
Ollama's JSON for mappings), ``encoding/json`` and field access."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..gofmt import format_value
from .errors import TemplateError


def truth(value: Any) -> bool:
    """Go's notion of a true value: not false, 0, nil, or empty."""
    if value is None:
        return False
    if isinstance(value, bool | int | float | str | bytes | list | tuple | dict):
        return bool(value)
    if isinstance(value, Mapping | Sequence):
        return len(value) > 0
    return True


def go_json(value: Any) -> str:
    """``encoding/json``'s compact output, HTML characters escaped as Go does."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def go_str(value: Any) -> str:
    """``fmt.Sprint`` of one value, as a template prints it: nil prints nothing, and
    mappings print as JSON: the structures templates print (tools, tool-call arguments) have
    ``String`` methods that return JSON in Ollama."""
    if value is None:
        return ""
    if isinstance(value, Mapping):
        return go_json(value)
    if isinstance(value, list | tuple):
        return "[" + " ".join(go_str(v) for v in value) + "]"
    return format_value(value)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def field_of(value: Any, name: str) -> Any:
    """``value.Name``: a mapping key by the Go name, its JSON (snake_case) spelling, or its
    lower-case spelling; absent keys read as nil, as with Ollama's ``missingkey=zero``."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        for key in (name, _snake(name), name.lower()):
            if key in value:
                return value[key]
        return None
    if hasattr(value, name):
        return getattr(value, name)
    raise TemplateError(f"can't evaluate field {name} in type {type(value).__name__}")
