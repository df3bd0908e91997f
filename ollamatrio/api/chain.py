"""The one chain every request goes through, whatever serves it.

A request reaches the server by one of three transports (the front door's own exchange,
hypercorn for an unusual connection, or an embedding application's ASGI server) and is
served by one of three ways (a Quart view, the streamed routes ahead of Quart, the event
stream: :class:`~.table.Way`).  Whatever the combination, :class:`Chain` is the outermost
ASGI app and applies each concern that holds for every request, in this order, once:

1. **Admission** (:meth:`Chain.refusal`): CORS (a disallowed origin 403, an allowed preflight
   204 with ``Allow``), then the DNS-rebinding guard (a foreign ``Host`` on a loopback server
   403), then, when ``OLLAMATRIO_AUTH=required``, the API key (:mod:`.auth_gate`: 401 without
   a known key, 403 without the route's scope, in the route's dialect).  Then the key's
   **quotas** (:mod:`..auth.quotas`): a key over a limit is answered 429 with
   ``Retry-After`` in the route's dialect (:mod:`.rate_limited`); an admitted request holds
   its place in the key's concurrency until its answer ends, and its tokens are charged
   then.
2. **The drain**: the request runs inside the shutdown guard (:class:`..http.drain.Drain`), so
   a request still running when the grace period ends is cut and told why.
3. **The error shape**: an error that reaches the chain before an answer began is answered in
   the route's dialect (:mod:`.error_shapes`); a stream that has begun ends with its
   encoder's last line instead (:attr:`RequestState.last_words`).
4. **The access line and the request metrics**, once the answer is complete (as Ollama's
   access log, with the duration), so they cost nothing before the first token; a client that
   left before any answer is logged and counted as 499, as nginx does.  The key's usage
   (:mod:`..auth.usage`) is recorded then too: the tokens the route reported in
   :class:`RequestState`, or the cause of its refusal.

The route that serves a request sees the chain's record of it, :class:`RequestState`, in its
scope (:func:`request_state`): a stream says there how it would end if cut short.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from ..auth.keys import ApiKey
from ..auth.quotas import Admission, OverLimit, Quotas
from ..auth.usage import FORBIDDEN, NO_KEY, RATE_LIMITED, UNAUTHORIZED, RequestUsage, UsageLedger
from ..errors import OllamatrioError, ServerShuttingDownError
from ..http.asgi import ANSWERED
from ..http.cors import OriginPolicy, cors_answer
from ..http.drain import Drain
from ..http.fleet_secret import matches, presented
from ..http.host_guard import allowed_host, is_loopback_bind
from .table import Route, Way, route_for, routes_of

if TYPE_CHECKING:
    from ..auth.keys import ApiKey
    from ..config import Settings
    from ..observability.metrics import ServerMetrics
    from .auth_gate import KeyGate

log = logging.getLogger(__name__)

ASGIApp = Callable[..., Awaitable[None]]
ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]

STATE = "ollamatrio.request"  # the scope key of a request's RequestState
CLIENT_CLOSED = 499  # nginx's status for a client that left before the answer
OTHER_ENDPOINT = "other"  # the metrics label of a path no route has

Headers = list[tuple[bytes, bytes]]

# Gin lists a path's methods in the order the server first registered each method.
_METHOD_ORDER = ("HEAD", "GET", "POST", "DELETE")


@dataclass
class RequestState:
    """What the chain and the route serving a request share about it."""

    route: Route | None  # None: no route answers this method on this path
    status: int | None = None  # once the answer has begun
    client_left: bool = False  # before the answer: the client closed (or half-closed)
    # How a stream that has begun ends when cut short (its encoder's error line or event).
    last_words: Callable[[str, int], bytes] | None = None
    key: ApiKey | None = None  # the authenticated key; None when authentication is off
    principal: str = ""  # the key's name, or the client's address when authentication is off
    refused: str | None = None  # why the chain refused it (auth.usage.REFUSAL_CAUSES)
    # The tokens it used, as its final chunk counted them (reported by the route).
    prompt_tokens: int = 0  # evaluated
    prompt_tokens_reused: int = 0
    generated_tokens: int = 0

    def tokens_used(self, prompt: int, reused: int = 0, generated: int = 0) -> None:
        """The route's report of a generation's or an embedding's counts (``prompt``
        evaluated, ``reused`` from a cache)."""
        self.prompt_tokens += prompt
        self.prompt_tokens_reused += reused
        self.generated_tokens += generated

    def usage(self) -> RequestUsage:
        return RequestUsage(
            self.prompt_tokens, self.prompt_tokens_reused, self.generated_tokens, self.refused
        )

    # As asked for (X-Priority, or a generation body's field), checked where the scheduler's
    # request is made (api/priority.py).
    priority: str = "interactive"


def request_state(scope: dict[str, Any]) -> RequestState:
    """The chain's record of the request in ``scope``."""
    state: RequestState = scope[STATE]
    return state


# The request the running task serves (and the tasks it starts): for the code that is not
# handed the scope (the scheduler's request in ApiContext.model_request, an embedding's
# tokens in pipeline.embed, the fleet gateway's relay).
_current: ContextVar[RequestState | None] = ContextVar("ollamatrio_request", default=None)


def current_request() -> RequestState | None:
    """The chain's record of the request this task serves; None outside a request."""
    return _current.get()


def allow_header(path: str) -> str:
    """``Allow`` for ``path``, as Gin writes it (its methods in the order Ollama registered
    them; a ``GET`` route answers ``HEAD`` too, as Werkzeug routes it)."""
    methods: set[str] = set()
    for route in routes_of(path):
        methods |= route.methods
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods, key=lambda m: (*_METHOD_ORDER, m).index(m)))


class Chain:
    """ASGI: the cross-cutting concerns around ``app``.  ``metrics`` gives the request
    metrics, or None while they do not exist yet (before the lazy app is built); ``usage``
    is where each key's usage is recorded (the app writes and shows it)."""

    def __init__(
        self, app: ASGIApp, settings: Settings, drain: Drain,
        metrics: Callable[[], ServerMetrics | None], usage: UsageLedger | None = None,
    ) -> None:  # fmt: skip
        self.app = app
        self.drain = drain
        self._metrics = metrics
        self.quotas = Quotas()
        self.usage = usage if usage is not None else UsageLedger()
        self._origins = OriginPolicy.from_origins(settings.origins)
        self._guard_hosts = is_loopback_bind(settings.host)
        self._gate: KeyGate | None = None
        if settings.auth == "required":
            # Imported here: a server that asks for no key never loads the key table (SQLite).
            from ..auth.keys import KeyStore
            from .auth_gate import KeyGate

            self._gate = KeyGate(KeyStore.in_folder(settings.state_dir))
        self._fleet_secret = settings.fleet_secret.encode()  # b"": not a fleet's host

    async def __call__(self, scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method: str = scope["method"]
        path: str = scope["path"]
        client = scope.get("client")
        state = RequestState(route_for(method, path), principal=client[0] if client else "")
        scope[STATE] = state
        arrived = trio.current_time()
        origin = host = None
        for name, value in scope["headers"]:
            name = name.lower()
            if name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"host":
                host = value.decode("latin-1")
            elif name == b"x-priority":
                state.priority = value.decode("latin-1").strip()
        cors = cors_answer(origin, host or "", method, self._origins)
        cors_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in cors.headers]

        async def chained_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                state.status = message["status"]
                if cors_headers:
                    message = {**message, "headers": [*message["headers"], *cors_headers]}
            await send(message)

        async def chained_receive() -> dict[str, Any]:
            message = await receive()
            # A disconnect after the transport answered itself (408, 400) is no client that
            # left: that answer was logged where it was made.
            if message["type"] == "http.disconnect" and ANSWERED not in message:
                state.client_left = state.client_left or state.status is None
            return message

        try:
            refused = await self.refusal(scope, state, host or "", cors.status)
            if refused is not None:
                await _answer(chained_send, *refused)
                return
            admitted = self.admit(state)
            if isinstance(admitted, OverLimit):
                state.refused = f"{RATE_LIMITED}_{admitted.limit}"
                await _answer_rate_limited(chained_send, path, admitted)
                return
            try:
                with self.drain.guard():
                    token = _current.set(state)
                    try:
                        await self.app(scope, chained_receive, chained_send)
                    finally:
                        _current.reset(token)
            finally:
                if admitted is not None:  # also when cancelled: synchronous, no checkpoint
                    admitted.done(state.usage().tokens)
        except Exception as exc:  # trio.Cancelled is a BaseException: it passes
            await self._failed(scope, state, exc, chained_send)
        finally:
            self._done(scope, state, arrived)

    def admit(self, state: RequestState) -> Admission | OverLimit | None:
        """The request's place in its key's quotas, or why it has none; None when there is
        nothing to limit (no key, no limits, a liveness route: those stay open)."""
        key = state.key
        route = state.route
        if key is None or route is None or route.way is Way.LIVENESS:
            return None
        limits = key.limits
        if not (limits.rpm or limits.tpm or limits.concurrency):
            return None
        return self.quotas.admit(key.name, limits)

    async def refusal(
        self, scope: dict[str, Any], state: RequestState, host: str, cors_status: int | None
    ) -> tuple[int, Headers, bytes] | None:
        """The answer (status, headers, body) that ends a request before its route, or None.
        Authenticating sets the state's ``key`` and ``principal``."""
        method: str = scope["method"]
        path: str = scope["path"]
        # CORS first, as Ollama: a disallowed origin gets 403, an allowed preflight 204.
        status = cors_status
        if status is None and self._guard_hosts and not allowed_host(host):
            status = 403
        # A fleet's host serves its gateway alone: every request carries the fleet secret.
        fleet = self._fleet_secret
        if status is None and fleet and not matches(presented(scope["headers"]), fleet):
            status = 401
        if status is None and method == "OPTIONS":
            status = 204
        if status is None:
            return await self._authentication(scope, state) if self._gate else None
        # As Ollama's c.Status: no body and no Content-Type.
        headers: Headers = [(b"content-length", b"0")]
        if method == "OPTIONS" and (allow := allow_header(path)):
            # Gin answers a preflight from its method-not-allowed path: Allow comes along.
            headers.append((b"allow", allow.encode()))
        return status, headers, b""

    async def _authentication(
        self, scope: dict[str, Any], state: RequestState
    ) -> tuple[int, Headers, bytes] | None:
        assert self._gate is not None
        key, refused = await self._gate.admit(state.route, scope["path"], scope["headers"])
        if key is not None:
            state.key, state.principal = key, key.name
        if refused is not None:  # counted in the key's usage (or under no key)
            state.refused = FORBIDDEN if key is not None else UNAUTHORIZED
        return refused

    async def _failed(
        self, scope: dict[str, Any], state: RequestState, exc: Exception, send: ASGISend
    ) -> None:
        """An error that reached the chain: its answer in the route's dialect, or the last
        words of a stream that has begun."""
        if state.status is None:
            # Imported here: the lazy app's liveness answers, which never fail, come
            # through this chain before Quart is imported.
            from .answers import send_response
            from .error_shapes import error_for_route

            await send_response(send, error_for_route(scope["path"], exc))
            return
        status = 503 if isinstance(exc, ServerShuttingDownError) else 500
        if isinstance(exc, OllamatrioError):
            log.warning("stream failed mid-way: %s", exc)
        else:
            log.error("unexpected error in a stream", exc_info=exc)
        if state.last_words is not None:
            body = state.last_words(str(exc), status)
            await send({"type": "http.response.body", "body": body, "more_body": False})

    def _done(self, scope: dict[str, Any], state: RequestState, arrived: float) -> None:
        self._record_usage(state)
        status = state.status or (CLIENT_CLOSED if state.client_left else None)
        if status is None:
            return  # the transport answered (and logged) it itself
        metrics = self._metrics()
        if metrics is not None:
            route = state.route
            metrics.request_done(route.endpoint if route else OTHER_ENDPOINT, status)
        log.info(
            "%s %s %d %.3fs", scope["method"], scope["path"], status,
            trio.current_time() - arrived, extra={"client": (scope.get("client") or ("",))[0]},
        )  # fmt: skip

    def _record_usage(self, state: RequestState) -> None:
        """The key's usage: only keys are counted (bounded: the keys that exist), so
        without authentication nothing is; a request refused as unauthorized (which
        authentication marks in :attr:`RequestState.refused`) counts under
        :data:`~..auth.usage.NO_KEY`."""
        if state.key is not None:
            self.usage.record(state.key.name, state.usage())
        elif state.refused == UNAUTHORIZED:
            self.usage.record(NO_KEY, RequestUsage(refused=UNAUTHORIZED))


async def _answer_rate_limited(send: ASGISend, path: str, over: OverLimit) -> None:
    # Imported here, as in Chain._failed: the chain itself imports no framework.
    from .answers import send_response
    from .rate_limited import rate_limited_response

    await send_response(send, rate_limited_response(path, over))


async def _answer(send: ASGISend, status: int, headers: Headers, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
