"""The fleet secret: what a fleet's gateway sends its hosts on every request, and what a host
started with ``OLLAMATRIO_FLEET_SECRET`` requires of every request (``api/chain.py``: 401
without it), so that a host reached directly, not through the gateway, serves nobody."""

from __future__ import annotations

import hmac
from typing import Final

HEADER: Final = b"x-ollamatrio-fleet-secret"


def header_line(secret: str) -> bytes:
    """The header as one line of a request head (with its CRLF)."""
    return HEADER + b": " + secret.encode() + b"\r\n"


def presented(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The secret a request carries (its first such header), or None."""
    return next((value for name, value in headers if name.lower() == HEADER), None)


def matches(offered: bytes | None, secret: bytes) -> bool:
    """Whether ``offered`` is the fleet's ``secret``, compared in constant time."""
    return offered is not None and hmac.compare_digest(offered, secret)
