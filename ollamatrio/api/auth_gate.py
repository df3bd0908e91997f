"""Authentication, a step of the request chain (:mod:`.chain`) when ``OLLAMATRIO_AUTH=required``.

A key comes as every client sends one: ``Authorization: Bearer <key>`` (the ``ollama`` and
``openai`` clients, Claude Code's ``ANTHROPIC_AUTH_TOKEN``) or ``x-api-key: <key>`` (the
``anthropic`` SDK, Claude Code's ``ANTHROPIC_API_KEY``).  Each route asks for a scope
(:attr:`.table.Route.scope`); an ``admin`` key holds every scope.  A path no route answers
asks for a key of any scope, so that its 404 or 405 tells nobody without one which paths
exist.  A refusal is in the route's dialect: 401 (with ``WWW-Authenticate: Bearer``) for a
missing, unknown or revoked key, 403 for a key without the scope.

Imported only when keys are required: the key table is SQLite, which a server that does not
ask for keys never loads.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from typing import Any

from ..auth.keys import ApiKey, KeyStore, prefix_of
from ..auth.ring import KeyRing
from ..wire import JSON, JSON_UTF8, json_bytes
from .table import Dialect, Route, Scope, dialect_of

log = logging.getLogger(__name__)

Headers = list[tuple[bytes, bytes]]
Answer = tuple[int, Headers, bytes]  # status, headers, body

ADMIN = Scope.ADMIN.value


def presented_secret(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The key a request presents: ``Authorization: Bearer`` first, else ``x-api-key``."""
    bearer = api_key = None
    for name, value in headers:
        name = name.lower()
        if name == b"authorization" and bearer is None:
            scheme, _, credentials = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                bearer = credentials.strip()
        elif name == b"x-api-key" and api_key is None and value.strip():
            api_key = value.decode("latin-1").strip()
    return bearer or api_key


def holds(key: ApiKey, scope: Scope) -> bool:
    return scope is Scope.OPEN or ADMIN in key.scopes or scope.value in key.scopes


class KeyGate:
    """Who may pass: the keys of the server's state folder."""

    def __init__(self, store: KeyStore) -> None:
        self.ring = KeyRing(store)

    async def admit(
        self, route: Route | None, path: str, headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[ApiKey | None, Answer | None]:
        """The request's key (None on an open route, or without a known key) and the
        refusal, if any: a known key without the route's scope comes with its 403."""
        if route is not None and route.scope is Scope.OPEN:
            return None, None
        dialect = dialect_of(path)
        secret = presented_secret(headers)
        key = await self.ring.key_for(secret) if secret else None
        if key is None:
            if secret is None:
                log.debug("refused %s: no API key", path)
                return None, unauthorized(dialect, "missing API key")
            # Never the secret itself: its public prefix, when it has one of ours.
            log.info("refused %s: unknown or revoked key (prefix %s)", path, prefix_of(secret))
            return None, unauthorized(dialect, "invalid API key")
        if route is not None and not holds(key, route.scope):
            log.info("refused %s: key %r lacks the %s scope", path, key.name, route.scope)
            return key, forbidden(dialect, route.scope)
        return key, None


def unauthorized(dialect: Dialect, reason: str) -> Answer:
    """401 in ``dialect``'s shape: as OpenAI's and Anthropic's APIs answer a bad key."""
    body: dict[str, Any]
    if dialect is Dialect.NATIVE:
        body = {"error": "unauthorized"}
    elif dialect is Dialect.ANTHROPIC:
        body = _anthropic("authentication_error", reason)
    else:
        body = _openai(
            f"{reason}: send it as 'Authorization: Bearer <key>'",
            "invalid_request_error",
            "invalid_api_key",
        )
    return _answer(401, dialect, body, [(b"www-authenticate", b"Bearer")])


def forbidden(dialect: Dialect, scope: Scope) -> Answer:
    """403 in ``dialect``'s shape: a key without ``scope``."""
    message = f"this API key lacks the '{scope.value}' scope"
    body: dict[str, Any]
    if dialect is Dialect.NATIVE:
        body = {"error": f"forbidden: {message}"}
    elif dialect is Dialect.ANTHROPIC:
        body = _anthropic("permission_error", message)
    else:
        body = _openai(message, "invalid_request_error", "insufficient_permissions")
    return _answer(403, dialect, body, [])


def _anthropic(kind: str, message: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": f"req_{secrets.token_hex(12)}",
    }


def _openai(message: str, kind: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _answer(status: int, dialect: Dialect, body: dict[str, Any], headers: Headers) -> Answer:
    data = json_bytes(body)
    content_type = JSON_UTF8 if dialect is Dialect.NATIVE else JSON
    return status, [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(data)).encode()),
        *headers,
    ], data  # fmt: skip
