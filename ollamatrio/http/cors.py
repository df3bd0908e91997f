"""CORS as Ollama answers it: gin-contrib/cors v1.7.2 with Ollama's configuration
(``server/routes.go``: the default methods, ``AllowWildcard``, ``AllowBrowserExtensions``,
its header list and ``OLLAMA_ORIGINS``).

Pure functions of the request's ``Origin``, ``Host`` and method, so that any HTTP layer can
answer the same way:

- no ``Origin``, or the server's own origin (``http://`` + ``Host``): not a CORS request,
  no headers;
- an origin ``OLLAMA_ORIGINS`` does not allow: ``403`` with no ``Access-Control-*`` header
  at all (a browser then sees a failed CORS check, nothing else);
- an allowed preflight (``OPTIONS``): ``204`` with the preflight headers;
- any other allowed request: the route answers, with ``Access-Control-Allow-Origin``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

Header = tuple[str, str]

# gin-contrib/cors's DefaultConfig methods, joined as it joins them.
ALLOW_METHODS = "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"
_OLLAMA_HEADERS = (
    "Authorization", "Content-Type", "User-Agent", "Accept", "X-Requested-With",
    # OpenAI compatibility headers (the OpenAI SDKs send them)
    "OpenAI-Beta", "x-stainless-arch", "x-stainless-async",
    "x-stainless-custom-poll-interval", "x-stainless-helper-method", "x-stainless-lang",
    "x-stainless-os", "x-stainless-package-version", "x-stainless-poll-helper",
    "x-stainless-retry-count", "x-stainless-runtime", "x-stainless-runtime-version",
    "x-stainless-timeout",
)  # fmt: skip
MAX_AGE = str(12 * 60 * 60)  # DefaultConfig's 12 hours, in seconds


def canonical_header_key(name: str) -> str:
    """Go's ``http.CanonicalHeaderKey``: ``x-stainless-lang`` → ``X-Stainless-Lang``."""
    return "-".join(word.capitalize() for word in name.lower().split("-"))


ALLOW_HEADERS = ",".join(canonical_header_key(h) for h in _OLLAMA_HEADERS)


@dataclass(frozen=True)
class OriginPolicy:
    """``OLLAMA_ORIGINS`` as gin-contrib/cors matches it: ``*`` alone allows every origin;
    an entry without ``*`` is compared exactly (entries are trimmed and lower-cased); in an
    entry with ``*``, each ``*`` stands for any text."""

    allow_all: bool
    exact: frozenset[str]
    wildcards: tuple[re.Pattern[str], ...]

    @classmethod
    def from_origins(cls, origins: Iterable[str]) -> OriginPolicy:
        entries = [o.strip() for o in origins if o.strip()]
        return cls(
            allow_all="*" in entries,
            exact=frozenset(o.lower() for o in entries if "*" not in o),
            wildcards=tuple(
                re.compile(".*".join(re.escape(part) for part in o.split("*")), re.DOTALL)
                for o in entries
                if "*" in o and o != "*"
            ),
        )


def origin_allowed(origin: str, policy: OriginPolicy) -> bool:
    """Whether ``policy`` lets pages from ``origin`` call this server."""
    return (
        policy.allow_all
        or origin in policy.exact
        or any(p.fullmatch(origin) for p in policy.wildcards)
    )


def is_cors_request(origin: str | None, host: str) -> bool:
    """A request with an ``Origin`` other than the server's own (fetch() sends one even to
    its own origin; gin-contrib/cors leaves those alone)."""
    return bool(origin) and origin not in (f"http://{host}", f"https://{host}")


def cors_response_headers(origin: str, method: str, policy: OriginPolicy) -> list[Header]:
    """The ``Access-Control-*`` (and ``Vary``) headers for a CORS request from an allowed
    ``origin``: the preflight set for ``OPTIONS``, the plain set otherwise."""
    headers: list[Header] = []
    if method == "OPTIONS":
        headers += [
            ("Access-Control-Allow-Methods", ALLOW_METHODS),
            ("Access-Control-Allow-Headers", ALLOW_HEADERS),
            ("Access-Control-Max-Age", MAX_AGE),
        ]
    if policy.allow_all:
        headers.append(("Access-Control-Allow-Origin", "*"))
        return headers
    headers.append(("Vary", "Origin"))
    if method == "OPTIONS":
        headers += [
            ("Vary", "Access-Control-Request-Method"),
            ("Vary", "Access-Control-Request-Headers"),
        ]
    headers.append(("Access-Control-Allow-Origin", origin))
    return headers


@dataclass(frozen=True)
class CorsAnswer:
    """What CORS makes of one request: ``status`` is the answer to give at once (``403``
    for a disallowed origin, ``204`` for an allowed preflight) or None to go on to the
    route; ``headers`` go on whatever the answer is."""

    status: int | None
    headers: list[Header]


NOT_CORS = CorsAnswer(None, [])


def cors_answer(origin: str | None, host: str, method: str, policy: OriginPolicy) -> CorsAnswer:
    """gin-contrib/cors's ``applyCors`` for one request (``Origin``, ``Host``, method)."""
    if origin is None or not is_cors_request(origin, host):
        return NOT_CORS
    if not origin_allowed(origin, policy):
        return CorsAnswer(403, [])
    headers = cors_response_headers(origin, method, policy)
    return CorsAnswer(204 if method == "OPTIONS" else None, headers)
