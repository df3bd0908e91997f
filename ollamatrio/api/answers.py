"""One-piece answers as Quart responses: JSON in each dialect's content type, and no body."""

from __future__ import annotations

from typing import Any

from quart import Response

from ..wire import JSON, JSON_UTF8, json_bytes


def json_response(obj: Any, status: int = 200, content_type: str = JSON_UTF8) -> Response:
    """A JSON answer; native ones say their charset, as Gin's ``c.JSON`` (``/v1`` pass
    :data:`~ollamatrio.wire.JSON`)."""
    return Response(json_bytes(obj), status=status, content_type=content_type)


def v1_json_response(obj: Any, status: int = 200) -> Response:
    """A ``/v1`` JSON answer (OpenAI, Anthropic): no charset, as Ollama's middleware."""
    return json_response(obj, status, JSON)


def empty_response(status: int = 200) -> Response:
    """No body and, as Ollama's ``c.Status``, no Content-Type (Quart would say text/html)."""
    response = Response(b"", status=status)
    del response.headers["Content-Type"]
    return response
