"""The Anthropic error shape of the ``/v1/messages`` routes (served in :mod:`.routes`).

Statuses are those of every route (:mod:`.errors`); the body is Anthropic's
``{"type": "error", "error": {"type", "message"}}`` with its type for the status, and a
full queue's 503 (``overloaded_error``) carries ``Retry-After``.
"""

from __future__ import annotations

import logging

from quart import Response
from werkzeug.exceptions import HTTPException

from ..errors import OllamatrioError
from ..wire import json_bytes
from . import anthropic_wire as wire
from .errors import error_headers, message_for, status_for

log = logging.getLogger(__name__)

# The routes whose errors take this shape.
PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})


def anthropic_error_response(exc: BaseException) -> Response:
    """The Anthropic-shaped error response for ``exc``."""
    status = status_for(exc)
    if status >= 500 and not isinstance(exc, OllamatrioError | HTTPException):
        log.error("unexpected error while handling a request", exc_info=exc)
    elif status >= 500:
        log.warning("request failed: %s", exc)
    return Response(
        json_bytes(wire.error_object(message_for(exc), status)),
        status=status,
        content_type="application/json",
        headers=error_headers(status),
    )
