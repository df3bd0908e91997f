"""The one place where errors become HTTP statuses and ``{"error": ...}`` bodies.

As Ollama's ``handleScheduleError``: invalid requests and missing capabilities are 400,
unknown models 404, a full queue 503, anything else 500.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from quart import Response
from werkzeug.exceptions import HTTPException

from ..errors import (
    InvalidRequestError,
    ModelNotFoundError,
    OllamatrioError,
    QueueFullError,
    RequestTooLargeError,
    SchedulerClosedError,
)
from ..store import os_reason
from ..wire import JSON, JSON_UTF8, json_bytes

log = logging.getLogger(__name__)

# A dialect's error body for (message, status).
ErrorShape = Callable[[str, int], dict[str, Any]]

# Seconds a client refused with a 503 (a full queue, a server shutting down) is told to
# wait before trying again (Ollama sends no Retry-After).
RETRY_AFTER_SECONDS = 1


def status_for(exc: BaseException) -> int:
    if isinstance(exc, RequestTooLargeError):
        return 413
    if isinstance(exc, InvalidRequestError):
        return 400
    if isinstance(exc, ModelNotFoundError):
        return 404
    if isinstance(exc, QueueFullError | SchedulerClosedError):
        return 503
    if isinstance(exc, HTTPException) and exc.code is not None:
        return exc.code
    return 500


# A path into the model store, as OS errors and llama.cpp's messages spell them.
_STORE_PATH = re.compile(r"""[^\s'"]*/(blobs/sha256-[0-9a-fA-F]{64}[^\s'"]*|manifests/[^\s'"]+)""")


def message_for(exc: BaseException) -> str:
    """The body's words: never a server path (the log has those).  Store errors name the
    model or digest themselves; an OS error that gets here unwrapped is its reason only,
    and a path into the store elsewhere (a runner's load error) is cut to its blob's or
    manifest's name."""
    if isinstance(exc, HTTPException):
        return (
            (exc.description or exc.name).rstrip(".").lower()
            if exc.code != 404
            else ("404 page not found")
        )
    if isinstance(exc, OSError):
        return os_reason(exc)
    return _STORE_PATH.sub(_store_name, str(exc)) or type(exc).__name__


def _store_name(match: re.Match[str]) -> str:
    found = match.group(1)
    return found.removeprefix("blobs/") if found.startswith("blobs/") else found


def error_headers(status: int) -> dict[str, str]:
    """``Retry-After`` on a 503: the refusal is temporary."""
    return {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else {}


def native_error_object(message: str, status: int) -> dict[str, Any]:
    """Ollama's error body: ``{"error": message}``."""
    return {"error": message}


def error_response(message: str, status: int, shape: ErrorShape = native_error_object) -> Response:
    return Response(
        json_bytes(shape(message, status)),
        status=status,
        # Gin's c.JSON on the native routes; /v1 errors as Ollama's middleware writes them.
        content_type=JSON_UTF8 if shape is native_error_object else JSON,
        headers=error_headers(status),
    )


def response_for(exc: BaseException, shape: ErrorShape = native_error_object) -> Response:
    """The error response for ``exc`` in a dialect's ``shape`` (the status is the same on
    every route); unexpected ones (not ours) are logged with a trace."""
    status = status_for(exc)
    if status >= 500 and not isinstance(exc, OllamatrioError | HTTPException):
        log.error("unexpected error while handling a request", exc_info=exc)
    elif status >= 500:
        log.warning("request failed: %s", exc)
    return error_response(message_for(exc), status, shape)
