"""The request head's ``Host`` and ``Origin`` as every route sees them, and the DNS-rebinding
guard.

- :func:`head_problem`: one view of the head for every route, checked before any routing (the
  front door's own requests and hypercorn's alike): a second ``Host`` or ``Origin`` (routes
  would read different copies) or a ``Host`` that is no host name is refused with 400, as Go's
  ``net/http`` refuses ``too many Host headers`` and ``malformed Host header``.
- :func:`allowed_host`: Ollama's ``allowedHostsMiddleware``: a server bound to loopback answers
  only requests whose ``Host`` names this machine, so a page on another site that resolves its
  own name to 127.0.0.1 cannot reach the API through the browser.

Pure functions of the bind address and the head (the machine's own addresses aside), shared by
every route (the Quart views, the streamed routes, the events stream).
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Iterable

import psutil

from ..config import split_host_port

_LOCAL_SUFFIXES = (".localhost", ".local", ".internal")

# The bytes Go's net/http takes in a Host header (httpguts.ValidHostHeader): letters, digits,
# sub-delims, ``%`` (pct-encoding, IPv6 zones), ``:`` ``[`` ``]`` (ports, IPv6 literals).
_HOST_BYTES = re.compile(r"[0-9A-Za-z!$%&'()*+,\-.:;=\[\]_~]*")
_PORT = re.compile(r"[0-9]{0,5}")
MAX_LABEL = 63  # DNS: a label is 1 to 63 bytes
MAX_NAME = 253  # and a name at most 253 (a trailing dot aside)

TOO_MANY_HOSTS = "too many Host headers"
TOO_MANY_ORIGINS = "too many Origin headers"
MALFORMED_HOST = "malformed Host header"


def head_problem(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why a request with these headers (names lower-cased, as ASGI has them) must be refused
    with 400 before any route reads it, or None: a second ``Host`` or ``Origin``, or a
    ``Host`` that is no host name (:func:`valid_host`)."""
    host: bytes | None = None
    origins = 0
    for name, value in headers:
        if name == b"host":
            if host is not None:
                return TOO_MANY_HOSTS
            host = value
        elif name == b"origin":
            origins += 1
            if origins > 1:
                return TOO_MANY_ORIGINS
    if host is not None and not _valid_host_bytes(host):
        return MALFORMED_HOST
    return None


@functools.lru_cache(maxsize=256)
def _valid_host_bytes(value: bytes) -> bool:
    """:func:`valid_host`, remembered: a server sees few distinct Hosts (the check is most of
    :func:`head_problem`'s cost, about 1 µs uncached)."""
    return valid_host(value.decode("latin-1"))


def valid_host(header: str) -> bool:
    """Whether a ``Host`` value is ``host[:port]`` with a host that parses: empty (allowed by
    RFC 9112 when the target has no authority), an IP literal (IPv6 in brackets, or bare as
    Ollama's guard reads it), or a name of dot-separated labels of 1 to 63 bytes (one
    trailing dot allowed).  Only the bytes Go accepts in a Host; a port is digits."""
    if not _HOST_BYTES.fullmatch(header):
        return False
    if header.startswith("["):
        literal, bracket, port = header[1:].partition("]")
        if not bracket or (port and not (port[0] == ":" and _PORT.fullmatch(port[1:]))):
            return False
        return _ip(literal) is not None and ":" in literal
    if "[" in header or "]" in header:
        return False
    if header.count(":") > 1:  # a bare IPv6 literal: no port can be told apart
        return _ip(header) is not None
    name, _, port = header.partition(":")
    if not _PORT.fullmatch(port):
        return False
    return valid_name(name)


def valid_name(name: str) -> bool:
    """A host name (or dotted IPv4 address) as DNS allows it: labels of 1 to 63 bytes, 253 in
    all, one trailing dot allowed; empty is no name but a valid (empty) Host."""
    if not name:
        return True
    labels = name.removesuffix(".").split(".")
    return len(name) <= MAX_NAME + 1 and all(0 < len(label) <= MAX_LABEL for label in labels)


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
    loopback, private or unspecified addresses (as Go's ``netip.Addr`` defines them, which
    is narrower than Python's ``is_private``) or one of this machine's own pass; anything
    else is a rebinding attempt."""
    try:
        host, _ = split_host_port(header)
    except ValueError:
        host = header
    host = host.strip("[]").lower()
    ip = _ip(host)
    if ip is not None:
        return go_local_address(ip) or _is_own_address(ip)
    if host in ("", "localhost") or host == socket.gethostname().lower():
        return True
    return host.endswith(_LOCAL_SUFFIXES)


Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Go's netip.Addr.IsPrivate (RFC 1918, RFC 4193): nothing else.  Python's is_private adds
# link-local, documentation, benchmarking, "this network" and more: a page could reach the
# API through a name that resolves to 169.254.169.254 or 192.0.2.1.
_PRIVATE = tuple(
    ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
_UNSPECIFIED = (ipaddress.IPv4Address(0), ipaddress.IPv6Address(0))


def go_local_address(ip: Address) -> bool:
    """Go's ``IsLoopback() || IsPrivate() || IsUnspecified()`` on a ``netip.Addr``: 127/8 and
    ``::1``; 10/8, 172.16/12, 192.168/16 and ``fc00::/7``; ``0.0.0.0`` and ``::``.  The first
    two read an IPv4-mapped IPv6 address as its IPv4 address; the last does not."""
    if ip in _UNSPECIFIED:
        return True
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return True
    return any(ip.version == net.version and ip in net for net in _PRIVATE)


def _is_own_address(ip: Address) -> bool:
    """Ollama's ``isLocalIP``: ``ip`` (its zone included) is one of this machine's interface
    addresses."""
    text = str(ip)
    return any(
        address.family in (socket.AF_INET, socket.AF_INET6)
        and address.address.partition("%")[0] == text
        for addresses in psutil.net_if_addrs().values()
        for address in addresses
    )


def _ip(text: str) -> Address | None:
    """Go's ``netip.ParseAddr``: an IPv4 or IPv6 address (a zone allowed), else None."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
