"""The OpenAI error shape of every ``/v1`` route but Anthropic's: statuses as on the native
routes (:mod:`..errors`), the body OpenAI's ``{"error": {"message", "type", ...}}``."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from quart import Response

from ..errors import response_for
from . import wire

Handler = Callable[..., Awaitable[Response]]


def openai_error_response(exc: BaseException) -> Response:
    """The OpenAI-shaped error response for ``exc`` (statuses as on the native routes)."""
    return response_for(exc, wire.error_object)


def openai_errors(handler: Handler) -> Handler:
    """Answer any error raised by ``handler`` (before its body streams) in OpenAI's shape."""

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Response:
        try:
            return await handler(*args, **kwargs)
        except Exception as exc:  # trio.Cancelled is a BaseException: it passes
            return openai_error_response(exc)

    return wrapper
