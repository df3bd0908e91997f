"""The console's files, each read once, answered with its type, a validator and a strict
Content-Security-Policy (the page runs only its own scripts and styles, talks only to its
own server, and cannot be framed)."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

PREFIX: Final = "/ui"
STATIC: Final = Path(__file__).resolve().parent / "static"
INDEX: Final = "index.html"

_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}

# Nothing inline, nothing from elsewhere: images are ``data:``/``blob:`` URLs of files the
# user drops in the playground.
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# The files change only with the package: a browser revalidates (cheap, 304) on each load.
_SECURITY: Final = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-cache"),
]

ASGISend = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


@cache
def _assets() -> dict[str, Asset]:
    """Every file of ``static/`` by its name under ``/ui/`` (read on the first request)."""
    found: dict[str, Asset] = {}
    for path in sorted(STATIC.rglob("*")):
        content_type = _TYPES.get(path.suffix)
        if path.is_file() and content_type is not None:
            body = path.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
            found[path.relative_to(STATIC).as_posix()] = Asset(body, content_type, etag)
    return found


def console_asset(path: str) -> Asset | None:
    """The file a console path names (``/ui`` and ``/ui/`` are the page); None if none.
    Only the package's own files are ever named: a path is looked up, never joined."""
    if path in (PREFIX, PREFIX + "/"):
        return _assets().get(INDEX)
    return _assets().get(path.removeprefix(PREFIX + "/")) if path.startswith(PREFIX + "/") else None


async def answer_console(scope: dict[str, Any], send: ASGISend) -> None:
    """Answer ``GET``/``HEAD`` of a console path: the file, 304 when the browser holds it
    already, 404 for a name the console does not have."""
    asset = console_asset(scope["path"])
    if asset is None:
        body = b"404 page not found"
        await _send(send, 404, [(b"content-type", b"text/plain")], body, scope["method"])
        return
    headers = [(b"content-type", asset.content_type.encode()), (b"etag", asset.etag.encode())]
    headers += _SECURITY
    presented = next((v for k, v in scope["headers"] if k.lower() == b"if-none-match"), None)
    if presented is not None and asset.etag.encode() in presented:
        await _send(send, 304, headers, b"", "HEAD")
        return
    await _send(send, 200, headers, asset.body, scope["method"])


async def _send(
    send: ASGISend, status: int, headers: list[tuple[bytes, bytes]], body: bytes, method: str
) -> None:
    length = [(b"content-length", b"%d" % len(body))] if status != 304 else []
    await send({"type": "http.response.start", "status": status, "headers": headers + length})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})
