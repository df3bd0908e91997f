"""Wire formats every layer shares: NDJSON lines, server-sent events, RFC 3339 timestamps and
nanosecond durations.  A leaf: it imports nothing of the project."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

NDJSON = "application/x-ndjson"
JSON = "application/json"  # /v1 answers, as Ollama's OpenAI and Anthropic middleware writes them
# Gin's c.JSON: every native answer in one piece, and the native errors.
JSON_UTF8 = "application/json; charset=utf-8"
SSE = "text/event-stream"
SSE_DONE = b"data: [DONE]\n\n"

# Go's time.Duration is int64 nanoseconds, so Ollama's "forever" expiry lies ~292 years ahead.
FOREVER = timedelta(days=292 * 365)


class _Now:
    """Now in RFC 3339 (UTC, microseconds), the date and time of day formatted once a second:
    every streamed line carries one."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        return f"{self._prefix}{int((now - second) * 1e6):06d}Z"


rfc3339_now = _Now()


def rfc3339(moment: datetime | None = None) -> str:
    """RFC 3339 with microseconds; UTC is written ``Z`` as Go does."""
    if moment is None:
        return rfc3339_now()
    if moment.tzinfo is None:
        moment = moment.astimezone()
    text = moment.isoformat(timespec="microseconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def rfc3339_from_timestamp(seconds: float | None) -> str:
    """A wall-clock time in seconds since the epoch; ``None`` means never (far future)."""
    if seconds is None:
        return rfc3339(datetime.now(UTC) + FOREVER)
    return rfc3339(datetime.fromtimestamp(seconds, UTC))


def ns(seconds: float) -> int:
    """Seconds to integer nanoseconds, Ollama's unit for every duration."""
    return max(0, round(seconds * 1e9))


def json_bytes(obj: Any) -> bytes:
    """Compact JSON: one line, no padding, UTF-8."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def ndjson_line(obj: Any) -> bytes:
    return json_bytes(obj) + b"\n"
