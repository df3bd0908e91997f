"""Logging set-up: stdlib ``logging`` with one readable line per record.

Lines look like ``2026-01-02T03:04:05.678Z INFO ollamatrio.sched: loaded model=x
request_id=ab12``: fields passed through ``extra=`` are printed as ``key=value``, and the
current request id (a context variable, so each Trio task sees its own) is appended.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from .config import Settings

TRACE = 5  # below DEBUG; Ollama's OLLAMA_DEBUG=2
logging.addLevelName(TRACE, "TRACE")

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_RECORD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

# Libraries that log every HTTP exchange at INFO; only shown at TRACE.
_CHATTY_LOGGERS = ("httpx", "httpcore", "hpack")


def level_for(debug: int) -> int:
    """Map OLLAMA_DEBUG to a logging level: 0 INFO, 1 DEBUG, 2+ TRACE, negative WARNING."""
    if debug < 0:
        return logging.WARNING
    return (logging.INFO, logging.DEBUG)[debug] if debug < 2 else TRACE


@contextmanager
def bound_request_id(value: str) -> Iterator[None]:
    """Tag every line logged inside the block (in this task) with ``request_id=value``."""
    token = request_id.set(value)
    try:
        yield
    finally:
        request_id.reset(token)


def _format_value(value: object) -> str:
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


class KeyValueFormatter(logging.Formatter):
    """``time level logger: message key=value ...`` with UTC millisecond timestamps."""

    converter = staticmethod(time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        stamp = self.formatTime(record, "%Y-%m-%dT%H:%M:%S")
        # Private attributes are other libraries' bookkeeping (Ray's log record factory adds
        # ``_ray_timestamp_ns`` to every record once imported), not a caller's ``extra``.
        fields = {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRS and k[0] != "_"}
        rid = getattr(record, "request_id", None) or request_id.get()
        if rid is not None:
            fields["request_id"] = rid
        line = f"{stamp}.{int(record.msecs):03d}Z {record.levelname} {record.name}: "
        line += record.getMessage()
        if fields:
            line += " " + " ".join(f"{k}={_format_value(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


def configure_logging(settings: Settings, stream: TextIO | None = None) -> logging.Handler:
    """Send all logging to ``stream`` (default stderr) at the level OLLAMA_DEBUG asks for.

    Idempotent: a handler installed by an earlier call is replaced.  Returns the handler.
    """
    level = level_for(settings.debug)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    handler._ollamatrio = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_ollamatrio", False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    for name in _CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(TRACE if level <= TRACE else logging.WARNING)
    return handler
