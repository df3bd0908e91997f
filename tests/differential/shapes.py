"""What the differential suite compares: a response reduced to what a client depends on
(status, the headers clients read, the JSON shape at every level, stream line shapes,
error texts, chosen values), and the differences between two such reductions.

A JSON shape keeps keys and JSON types, not values: generated text, timings and digests
differ between any two servers.  Numbers keep the type their text has (``10000`` is an
integer, ``10000.0`` a float), since Python and TypeScript clients see the difference.
Lists merge the shapes of their items; an empty list is its own shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# The headers clients act on.  Content-Type is compared as media type plus charset.
HEADERS = (
    "content-type",
    "allow",
    "access-control-allow-origin",
    "access-control-allow-methods",
    "access-control-allow-headers",
    "access-control-allow-credentials",
    "access-control-expose-headers",
    "access-control-max-age",
)


def shape(value: Any) -> Any:
    """``value``'s JSON shape: dicts keep their keys, lists merge their items' shapes."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        if not value:
            return "list(empty)"
        merged: Any = None
        for item in value:
            merged = _merge(merged, shape(item))
        return [merged]
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    return "string"


def _merge(a: Any, b: Any) -> Any:
    """One shape for two list items: dicts unite their keys; other mixes become a sorted
    set of alternatives (``"integer|string"``)."""
    if a is None or a == b:
        return b
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for key, value in b.items():
            out[key] = _merge(out.get(key), value)
        return out
    if isinstance(a, list) and isinstance(b, list):
        return [_merge(a[0], b[0])]
    alternatives = set(str(a).split("|")) | set(str(b).split("|"))
    return "|".join(sorted(alternatives))


def stream_shape(shapes: list[Any]) -> list[Any]:
    """A stream's line (or event) shapes, independent of how many tokens it carried: the
    first, each different middle one once (in order of appearance), the last."""
    if len(shapes) <= 2:
        return list(shapes)
    middle: list[Any] = []
    for item in shapes[1:-1]:
        if item not in middle:
            middle.append(item)
    return [shapes[0], *middle, shapes[-1]]


@dataclass
class Reduced:
    """One response, reduced."""

    status: int
    headers: dict[str, str]
    body: Any  # a JSON shape, a stream's shapes, or a plain text body verbatim
    values: dict[str, Any] = field(default_factory=dict)  # compared exactly


def content_type(raw: str) -> str:
    parts = [part.strip().lower() for part in raw.split(";") if part.strip()]
    return "; ".join(parts)


def reduce_body(media: str, data: bytes) -> tuple[Any, Any]:
    """(shape, parsed) of a body: JSON, NDJSON, SSE, or text (kept verbatim)."""
    text = data.decode(errors="replace")
    if media == "application/x-ndjson":
        parsed = [json.loads(line) for line in text.splitlines() if line.strip()]
        return {"ndjson": _lines(parsed)}, parsed
    if media == "text/event-stream":
        events = _sse(text)
        by_name: dict[str, Any] = {"events": stream_shape([name for name, _ in events])}
        for name, data in events:
            by_name[name] = _merge(by_name.get(name), shape(data))
        return {"sse": by_name}, events
    if media == "application/json" or text[:1] in "{[":
        try:
            parsed = json.loads(text)
        except ValueError:
            return {"text": text}, text
        return shape(parsed), parsed
    return {"text": text}, text


def _lines(parsed: list[Any]) -> dict[str, Any]:
    """NDJSON lines: the first, the last, and the middle ones merged into one shape."""
    out: dict[str, Any] = {"first": shape(parsed[0]) if parsed else None}
    middle: Any = None
    for item in parsed[1:-1]:
        middle = _merge(middle, shape(item))
    if middle is not None:
        out["middle"] = middle
    if len(parsed) > 1:
        out["last"] = shape(parsed[-1])
    return out


def _sse(text: str) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = "message", []
        for line in block.splitlines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if not data:
            continue
        joined = "\n".join(data)
        try:
            events.append((name, json.loads(joined)))
        except ValueError:  # OpenAI's last event, data: [DONE]
            events.append((f"{name} {joined}", joined))
    return events


def error_text(parsed: Any) -> Any:
    """An error answer's words as clients read them: Ollama's ``error``, OpenAI's and
    Anthropic's ``error.message`` (with ``error.type``)."""
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict):
            return {"message": error.get("message"), "type": error.get("type")}
        if error is not None:
            return error
    return None


def differences(ours: Reduced, theirs: Reduced) -> list[tuple[str, Any, Any]]:
    """``(where, ours, theirs)`` for everything that differs.  ``where`` names the part:
    ``status``, ``header/<name>``, ``body/<key>/items/<key>...`` (``items``: a list's
    items), ``value/<name>``."""
    out: list[tuple[str, Any, Any]] = []
    if ours.status != theirs.status:
        out.append(("status", ours.status, theirs.status))
    for name in HEADERS:
        a, b = ours.headers.get(name), theirs.headers.get(name)
        if a != b:
            out.append((f"header/{name}", a, b))
    _diff("body", ours.body, theirs.body, out)
    for name in sorted(set(ours.values) | set(theirs.values)):
        a, b = ours.values.get(name), theirs.values.get(name)
        if a != b:
            out.append((f"value/{name}", a, b))
    return out


def _diff(where: str, a: Any, b: Any, out: list[tuple[str, Any, Any]]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a:
                out.append((f"{where}/{key}", "(absent)", _brief(b[key])))
            elif key not in b:
                out.append((f"{where}/{key}", _brief(a[key]), "(absent)"))
            else:
                _diff(f"{where}/{key}", a[key], b[key], out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) == 1:
        _diff(f"{where}/items", a[0], b[0], out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(f"{where}/{index}", x, y, out)
    elif a != b:
        out.append((where, _brief(a), _brief(b)))


def _brief(value: Any) -> Any:
    """A shape small enough for a failure message."""
    text = json.dumps(value)
    return value if len(text) <= 200 else text[:200] + "…"
