"""One-piece answers as Quart responses: JSON in each dialect's content type, and no body."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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


async def send_response(
    send: Callable[[dict[str, Any]], Awaitable[None]], response: Response
) -> None:
    """``response`` written as plain ASGI (by the routes served ahead of Quart, and by the
    request chain), its length announced, so that a transport that writes the head at once
    (hypercorn, the front door for a blob upload) need not send chunks."""
    data = await response.get_data()
    body = data if isinstance(data, bytes) else data.encode()
    headers = [
        (k.encode("latin-1"), v.encode("latin-1"))
        for k, v in response.headers.items()
        if k.lower() != "content-length"
    ]
    headers.append((b"Content-Length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
