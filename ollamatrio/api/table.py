"""Every route the server answers, in one table: its path, methods, dialect, and whether it
streams.

The table is plain data, cheap to import: the front door learns from it which bodies to
limit before reading them, the request chain (:mod:`.chain`) which dialect's error shape
and metrics label a request gets, the lazy app (:mod:`.lazy`) which paths it answers before
the app exists, the streamed routes (:mod:`.routes`) which of them they serve, and the
Quart app (:mod:`.app`) which views it registers.  A test holds each of them to it.

Each route says which way serves it (:class:`Way`): a Quart view (one-piece answers), the
streamed routes ahead of Quart (``api/routes.py``: the generations carry every token through
them, and pull, push, create and blob uploads stream their progress or body), the
scheduler's event stream (``observability/events.py``), or the console's files
(``console/``).  Whatever the way, the request first goes through the one chain of
:mod:`.chain`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from .bodies import MAX_JSON_BODY


class Way(StrEnum):
    """What serves a route."""

    LIVENESS = "liveness"  # answered at once, built app or not (api/liveness.py)
    VIEW = "view"  # a Quart view (api/app.py and the dialects' handlers)
    STREAM = "stream"  # plain ASGI ahead of Quart (api/routes.py)
    EVENTS = "events"  # GET /api/events (observability/events.py)
    CONSOLE = "console"  # the console's files, answered at once (console/assets.py)


class Dialect(StrEnum):
    """Whose conventions a route follows: its error shape and, for ``/v1``, its answers."""

    NATIVE = "native"  # Ollama's /api: {"error": "..."}
    OPENAI = "openai"  # OpenAI's /v1: {"error": {"message", "type", ...}}
    ANTHROPIC = "anthropic"  # /v1/messages: {"type": "error", "error": {...}}
    RESPONSES = "responses"  # OpenAI's Responses API: OpenAI's error shape


@dataclass(frozen=True)
class Route:
    """One path (Werkzeug's rule syntax: ``<name>`` is one segment, ``<path:name>`` any
    rest) and the methods it answers."""

    path: str
    methods: frozenset[str]
    dialect: Dialect
    way: Way = Way.VIEW
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", _compile(self.path))

    @property
    def streams(self) -> bool:
        """Whether the answer may come in pieces (and so may end with an error line)."""
        return self.way in (Way.STREAM, Way.EVENTS)

    @property
    def scope(self) -> Scope:
        """What an API key must hold to be served this route, when keys are required."""
        return scope_of(self.path)

    @property
    def endpoint(self) -> str:
        """The label a request of this route is counted under in ``/metrics``."""
        return self.path


def _compile(rule: str) -> re.Pattern[str]:
    parts = re.split(r"<(?:(path):)?(\w+)>", rule)
    regex = ""
    for i, part in enumerate(parts):
        if i % 3 == 0:
            regex += re.escape(part)
        elif i % 3 == 1:
            regex += ".+" if part == "path" else "[^/]+"
    return re.compile(regex)


def _route(path: str, methods: str, dialect: Dialect, way: Way = Way.VIEW) -> Route:
    return Route(path, frozenset(methods.split()), dialect, way)


NAT, OAI, ANT, RSP = Dialect.NATIVE, Dialect.OPENAI, Dialect.ANTHROPIC, Dialect.RESPONSES
LIVENESS, STREAM, EVENTS, CONSOLE = Way.LIVENESS, Way.STREAM, Way.EVENTS, Way.CONSOLE

ROUTES: tuple[Route, ...] = (
    # Liveness: answered at once, even before the app exists (api/liveness.py).
    _route("/", "GET HEAD", NAT, LIVENESS),
    _route("/api/version", "GET HEAD", NAT, LIVENESS),
    # Generations and progress streams.
    _route("/api/generate", "POST", NAT, STREAM),
    _route("/api/chat", "POST", NAT, STREAM),
    _route("/api/pull", "POST", NAT, STREAM),
    _route("/api/push", "POST", NAT, STREAM),
    _route("/api/create", "POST", NAT, STREAM),
    _route("/v1/completions", "POST", OAI, STREAM),
    _route("/v1/chat/completions", "POST", OAI, STREAM),
    _route("/v1/responses", "POST", RSP, STREAM),
    _route("/v1/messages", "POST", ANT, STREAM),
    _route("/v1/messages/count_tokens", "POST", ANT, STREAM),
    # One-piece answers (Quart views).
    _route("/api/embed", "POST", NAT),
    _route("/api/embeddings", "POST", NAT),
    _route("/api/rerank", "POST", NAT),  # ours: Ollama has none (api/rerank_wire.py)
    _route("/api/tags", "GET HEAD", NAT),
    _route("/api/show", "POST", NAT),
    _route("/api/ps", "GET", NAT),
    _route("/api/copy", "POST", NAT),
    _route("/api/delete", "DELETE", NAT),
    _route("/api/events", "GET", NAT, EVENTS),
    _route("/metrics", "GET", NAT),
    _route("/api/usage", "GET", NAT),  # each key's usage (api/usage.py)
    _route("/v1/embeddings", "POST", OAI),
    _route("/v1/rerank", "POST", OAI),  # llama-server's, Jina's and Cohere's shape
    _route("/v1/models", "GET", OAI),
    # Names hold ":" and "/" (namespace/model:tag): the path converter takes both.
    _route("/v1/models/<path:model>", "GET", OAI),
    _route("/v1/responses/<response_id>", "GET DELETE", RSP),
    _route("/v1/responses/<response_id>/input_items", "GET", RSP),
    # A blob's upload streams to disk (api/blob_upload.py); its HEAD is a view.
    _route("/api/blobs/<digest>", "POST", NAT, STREAM),
    _route("/api/blobs/<digest>", "HEAD", NAT),
    # The console in the browser (docs/console.md): its page and files.
    _route("/ui", "GET HEAD", NAT, CONSOLE),
    _route("/ui/", "GET HEAD", NAT, CONSOLE),
    _route("/ui/<path:file>", "GET HEAD", NAT, CONSOLE),
)


class Scope(StrEnum):
    """What an API key must hold for a route when ``OLLAMATRIO_AUTH=required`` (docs/api.md,
    "Keys"); an ``admin`` key holds every scope."""

    OPEN = "open"  # no key asked: clients probe these before anything else
    INFERENCE = "inference"
    ADMIN = "admin"
    METRICS = "metrics"


# Every native route's scope, by path (each method of a path asks the same); every /v1
# route is inference.  A route missing here fails the import (below), so none is forgotten.
_NATIVE_SCOPES: dict[str, Scope] = {
    "/": Scope.OPEN,
    "/api/version": Scope.OPEN,
    "/api/generate": Scope.INFERENCE,
    "/api/chat": Scope.INFERENCE,
    "/api/embed": Scope.INFERENCE,
    "/api/embeddings": Scope.INFERENCE,
    "/api/rerank": Scope.INFERENCE,
    "/api/tags": Scope.INFERENCE,
    "/api/show": Scope.INFERENCE,
    "/api/ps": Scope.INFERENCE,
    "/api/usage": Scope.ADMIN,
    "/api/events": Scope.INFERENCE,
    "/api/pull": Scope.ADMIN,
    "/api/push": Scope.ADMIN,
    "/api/create": Scope.ADMIN,
    "/api/copy": Scope.ADMIN,
    "/api/delete": Scope.ADMIN,
    "/api/blobs/<digest>": Scope.ADMIN,
    "/metrics": Scope.METRICS,
    # Static files: the page asks for a key itself, and sends it with each API call.
    "/ui": Scope.OPEN,
    "/ui/": Scope.OPEN,
    "/ui/<path:file>": Scope.OPEN,
}


def scope_of(path: str) -> Scope:
    """The scope of a route's path (its rule, as the table writes it)."""
    return Scope.INFERENCE if path.startswith("/v1/") else _NATIVE_SCOPES[path]


if _unscoped := [
    r.path for r in ROUTES if not r.path.startswith("/v1/") and r.path not in _NATIVE_SCOPES
]:
    raise RuntimeError(f"routes without a scope in api/table.py: {_unscoped}")

# The JSON bodies the front door limits before reading them (to MAX_JSON_BODY): every
# streamed POST's but a blob upload's.  (Quart's views read theirs with the same limit.)
JSON_STREAM_PATHS: tuple[str, ...] = tuple(
    r.path for r in ROUTES if r.way is Way.STREAM and "<" not in r.path
)


class BodyLimits:
    """The front door's view of the table (``http/front.py`` ``BodyLimits``)."""

    paths: ClassVar[list[str]] = list(JSON_STREAM_PATHS)
    body_limit = MAX_JSON_BODY


_EXACT: dict[str, list[Route]] = {}
for _r in ROUTES:
    if "<" not in _r.path:
        _EXACT.setdefault(_r.path, []).append(_r)
_PATTERNS = [r for r in ROUTES if "<" in r.path]


def routes_of(path: str) -> list[Route]:
    """The routes whose rule matches ``path`` (one per method set)."""
    exact = _EXACT.get(path)
    if exact is not None:
        return exact
    return [r for r in _PATTERNS if r.pattern.fullmatch(path)]


def route_for(method: str, path: str) -> Route | None:
    """The route that answers ``method`` on ``path``; None for an unknown path or method.
    A ``GET`` route answers ``HEAD`` too, as Werkzeug routes it."""
    found = routes_of(path)
    for route in found:
        if method in route.methods:
            return route
    if method == "HEAD":
        return route_for("GET", path) if found else None
    return None


def dialect_of(path: str) -> Dialect:
    """The dialect of a path, known or not: an unknown ``/v1`` path answers in OpenAI's
    shape, as Ollama's OpenAI middleware does."""
    found = routes_of(path)
    if found:
        return found[0].dialect
    return Dialect.OPENAI if path.startswith("/v1/") else Dialect.NATIVE


# A dialect's Quart views by (path, method): app.py registers each of the table's view
# routes from them, and refuses a view the table does not list.
View = Callable[..., Awaitable[Any]]
Views = dict[tuple[str, str], View]


def views_of(*rows: tuple[str, str, View]) -> Views:
    """Views from ``(methods, path, view)`` rows (methods separated by spaces)."""
    return {(path, method): view for methods, path, view in rows for method in methods.split()}
