"""The Anthropic error shape of the ``/v1/messages`` routes (served in :mod:`.routes`).

Statuses are those of every route (:mod:`.errors`); the body is Anthropic's
``{"type": "error", "error": {"type", "message"}}`` with its type for the status, and a
full queue's 503 (``overloaded_error``) carries ``Retry-After``.
"""

from __future__ import annotations

from quart import Response

from ..errors import response_for
from . import wire

# The routes whose errors take this shape.
PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})


def anthropic_error_response(exc: BaseException) -> Response:
    """The Anthropic-shaped error response for ``exc``."""
    return response_for(exc, wire.error_object)
