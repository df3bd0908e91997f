"""``GET`` and ``HEAD`` of ``/`` and ``/api/version``: a service manager's or a client's
liveness check, answered at once and in one place, whether the app is built yet or not
(:mod:`.lazy`, :mod:`.app`); Quart, its Flask and Werkzeug underneath, and the dialects are
never needed for them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .._version import OLLAMA_API_VERSION, __version__
from ..wire import JSON_UTF8, json_bytes

_ANSWERS: dict[str, tuple[bytes, bytes]] = {
    "/": (b"Ollama is running", b"text/plain; charset=utf-8"),
    # The Ollama API version this server implements (what clients compare), and the
    # project's own version beside it.
    "/api/version": (
        json_bytes({"version": OLLAMA_API_VERSION, "ollamatrio": __version__}),
        JSON_UTF8.encode(),
    ),
}


async def answer_liveness(
    scope: dict[str, Any], send: Callable[[dict[str, Any]], Awaitable[None]]
) -> None:
    """Answer a liveness route (its path is one of the table's ``Way.LIVENESS`` routes)."""
    body, content_type = _ANSWERS[scope["path"]]
    await send({
        "type": "http.response.start", "status": 200,
        "headers": [(b"content-type", content_type), (b"content-length", b"%d" % len(body))],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
