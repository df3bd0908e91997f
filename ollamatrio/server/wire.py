"""Wire formats of the native API: NDJSON lines, RFC 3339 timestamps, nanosecond durations,
and the aggregation of a stream into one object for ``"stream": false``."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta
from typing import Any

NDJSON = "application/x-ndjson"

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


class Primed:
    """An async iterator whose first item was already taken (to learn about early errors
    before a status line is sent); it gives that item back first.  Closing it closes the
    source, so a disconnect unwinds the source's ``async with`` blocks."""

    def __init__(self, first: Any, source: AsyncIterator[Any]) -> None:
        self._first: list[Any] = [first]
        self._source = source

    def __aiter__(self) -> Primed:
        return self

    async def __anext__(self) -> Any:
        if self._first:
            return self._first.pop()
        return await self._source.__anext__()

    async def aclose(self) -> None:
        aclose = getattr(self._source, "aclose", None)
        if aclose is not None:
            await aclose()


# Streams a handler primed for its response.  Quart closes a response body once it starts
# sending it; the HTTP connection (server/app.py) closes these too when the request ends,
# which covers a client that leaves after the handler returned but before the first byte.
primed_streams: ContextVar[list[AsyncIterator[Any]] | None] = ContextVar(
    "primed_streams", default=None
)


async def prime(source: AsyncIterator[Any]) -> Primed | None:
    """Take the first item of ``source`` now; errors before it propagate to the caller.
    ``None`` if the source is empty."""
    try:
        first = await source.__anext__()
    except StopAsyncIteration:
        return None
    except BaseException:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
        raise
    streams = primed_streams.get()
    if streams is not None:
        streams.append(source)
    return Primed(first, source)


async def ndjson_body(objects: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """Encode a stream of objects as NDJSON (Quart closes this generator on disconnect,
    which closes ``objects`` in turn)."""
    try:
        async for obj in objects:
            yield ndjson_line(obj)
    finally:
        aclose: Callable[[], Any] | None = getattr(objects, "aclose", None)
        if aclose is not None:
            await aclose()
