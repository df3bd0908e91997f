"""The DNS-rebinding guard, as Ollama's ``allowedHostsMiddleware``: a server bound to loopback
answers only requests whose ``Host`` names this machine, so a page on another site that
resolves its own name to 127.0.0.1 cannot reach the API through the browser.

Pure functions of the bind address and the ``Host`` header, shared by every route (the Quart
views, the streamed routes, the events stream).
"""

from __future__ import annotations

import ipaddress
import socket

from ..config import split_host_port

_LOCAL_SUFFIXES = (".localhost", ".local", ".internal")


def is_loopback_bind(host: str) -> bool:
    """Whether the server listens on loopback only: then the guard applies."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_host(header: str) -> bool:
    """Ollama's ``allowedHostsMiddleware`` for a server bound to loopback: local names and
    private, loopback or unspecified addresses pass; anything else is a rebinding attempt."""
    try:
        host, _ = split_host_port(header)
    except ValueError:
        host = header
    host = host.strip("[]").lower()
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return ip.is_loopback or ip.is_private or ip.is_unspecified
    if host in ("", "localhost") or host == socket.gethostname().lower():
        return True
    return host.endswith(_LOCAL_SUFFIXES)
