"""The Quart-Trio application: routes, the DNS-rebinding guard and CORS applied, error bodies."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from quart import Response, request
from quart.ctx import RequestContext
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from ..config import Settings
from ..errors import ServerShuttingDownError
from ..http.asgi import ANSWERED
from ..http.cors import CorsAnswer, OriginPolicy, cors_answer
from ..http.drain import Drain
from ..http.host_guard import allowed_host, is_loopback_bind
from ..observability.events import EventsRoute
from ..observability.metrics import CLIENT_CLOSED, CONTENT_TYPE, OTHER_ENDPOINT, ServerMetrics
from ..scheduler import Scheduler
from ..store import ModelStore
from .answers import empty_response
from .errors import response_for
from .models import ApiContext
from .native.handlers import OllamaApi
from .openai.errors import openai_error_response
from .openai.handlers import OpenAiApi
from .responses.handlers import ResponsesApi, prune_forever
from .responses.store import FILE_NAME as RESPONSES_FILE
from .responses.store import ResponseStore
from .routes import GenerationRoutes

log = logging.getLogger(__name__)


class _App(QuartTrio):
    def __init__(self, *args: Any, drain: Drain | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drain = drain or Drain()  # serve() cuts it when shutdown's grace period ends
        # The generation and progress streams, which the front door (http/front.py) serves
        # ahead of Quart: set by create_app.
        self.stream_routes: GenerationRoutes | None = None

    async def dispatch_request(self, request_context: RequestContext | None = None) -> Any:
        """The view, guarded: if shutdown cuts it, the answer is 503 (OpenAI's shape on
        ``/v1``, whose views answer errors themselves)."""
        try:
            with self.drain.guard():
                return await super().dispatch_request(request_context)
        except ServerShuttingDownError as exc:
            if request.path.startswith("/v1/"):
                return openai_error_response(exc)
            raise


class _LogClientLeft:
    """ASGI, around Quart: the access line of a request whose client left (or half-closed)
    before the answer.  Quart then cancels the view, and ``after_request``, which logs every
    other request's line, never runs."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        left = answered = False

        async def watched_receive() -> Any:
            nonlocal left
            message = await receive()
            # A disconnect after the exchange answered itself (408, 400) is no client that
            # left: that answer was logged where it was made.
            left = left or (message["type"] == "http.disconnect" and ANSWERED not in message)
            return message

        async def watched_send(message: Any) -> None:
            nonlocal answered
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, watched_receive, watched_send)
        if left and not answered:
            client = (scope.get("client") or ("",))[0]
            log.info("%s %s %s", scope["method"], scope["path"], CLIENT_CLOSED,
                     extra={"client": client})  # fmt: skip


# Gin lists a path's methods in the order the server first registered each method.
_METHOD_ORDER = ("HEAD", "GET", "POST", "DELETE")


def allow_header(exc: BaseException | None) -> dict[str, str]:
    """``Allow`` for a known path asked with another method, as Gin writes it."""
    if not isinstance(exc, MethodNotAllowed) or not exc.valid_methods:
        return {}
    known = set(exc.valid_methods) - {"OPTIONS"}
    ordered = sorted(known, key=lambda m: (*_METHOD_ORDER, m).index(m))
    return {"Allow": ", ".join(ordered)}


def routing_error(exc: MethodNotAllowed | NotFound) -> Response:
    """Gin's plain-text answers to an unknown path (404) and a known path asked with
    another method (405, with ``Allow``), on every route as in Ollama (its
    ``server/routes.go`` sets ``r.HandleMethodNotAllowed = true``)."""
    text = "405 method not allowed" if isinstance(exc, MethodNotAllowed) else "404 page not found"
    return Response(
        text,
        status=exc.code or 404,
        content_type="text/plain",
        headers=allow_header(exc),
    )


async def served_ahead() -> Response:
    raise RuntimeError(f"{request.method} {request.path} should have been served ahead of Quart")


def drain_of(app: QuartTrio) -> Drain:
    """The app's :class:`Drain` (``create_app`` made the app)."""
    assert isinstance(app, _App)
    return app.drain


def create_app(
    scheduler: Scheduler, store: ModelStore, settings: Settings, drain: Drain | None = None
) -> QuartTrio:
    """The app; ``drain`` is the one shutdown cuts (default: a new one, see :func:`drain_of`)."""
    # An explicit root: Quart would look it up from the package's __file__, which is None
    # when a folder named ollamatrio/ in the working directory shadows an editable install.
    app = _App("ollamatrio", root_path=str(Path(__file__).resolve().parent), drain=drain)
    app.config.update(
        RESPONSE_TIMEOUT=None,  # Quart's 60 s default would cut long generations silently
        BODY_TIMEOUT=None,  # blob uploads take as long as they take
        MAX_CONTENT_LENGTH=None,  # JSON bodies are limited when read (requests.read_json)
        PROVIDE_AUTOMATIC_OPTIONS=False,  # preflights are answered below
    )
    metrics = ServerMetrics(scheduler)
    responses = ResponseStore(settings.state_dir / RESPONSES_FILE, settings.responses_ttl)
    ctx = ApiContext(
        scheduler=scheduler, store=store, settings=settings, metrics=metrics, responses=responses
    )
    drain = app.drain
    app.extensions["ollamatrio"] = ctx
    OllamaApi(ctx).register(app)
    OpenAiApi(ctx).register(app)
    ResponsesApi(responses).register(app)

    @app.before_serving
    async def prune_stored_responses() -> None:
        app.nursery.start_soon(prune_forever, responses)

    origins = OriginPolicy.from_origins(settings.origins)
    guard_hosts = is_loopback_bind(settings.host)

    def cors() -> CorsAnswer:
        return cors_answer(
            request.headers.get("Origin"), request.headers.get("Host", ""), request.method, origins
        )

    @app.before_request
    async def cors_and_host_guard() -> Response | None:
        # CORS first, as Ollama: a disallowed origin gets 403, an allowed preflight 204.
        status = cors().status
        if status is None and guard_hosts and not allowed_host(request.headers.get("Host", "")):
            status = 403
        if status is None and request.method == "OPTIONS":
            status = 204
        if status is None:
            return None
        response = empty_response(status)
        if request.method == "OPTIONS":
            # Gin answers a preflight from its method-not-allowed path: Allow comes along.
            response.headers.update(allow_header(request.routing_exception))
        return response

    @app.after_request
    async def cors_headers(response: Response) -> Response:
        # One line per request, as Ollama's access log (streams: when the first line is ready).
        log.info(
            "%s %s %d",
            request.method,
            request.path,
            response.status_code,
            extra={"client": request.remote_addr},
        )
        for name, value in cors().headers:
            response.headers.add(name, value)
        return response

    @app.after_request
    async def count_request(response: Response) -> Response:
        rule = request.url_rule
        endpoint = rule.rule if rule is not None else OTHER_ENDPOINT
        metrics.request_done(endpoint, response.status_code)
        return response

    @app.route("/metrics", methods=["GET"])
    async def prometheus_metrics() -> Response:
        return Response(await metrics.render(), content_type=CONTENT_TYPE)

    # The generation routes and the progress streams (pull, create) run as plain ASGI in
    # front of Quart (api/routes.py); the front door (http/front.py) calls them
    # directly.  Pulls run in the app's nursery, which Quart opens at startup.
    app.stream_routes = GenerationRoutes(
        _LogClientLeft(app.asgi_app),
        ctx,
        drain,
        origins,
        guard_hosts,
        allowed_host,
        lambda: app.nursery,
    )
    # Quart types asgi_app with hypercorn's scope and event types; these apps take plain
    # dicts, and mypy refuses assigning to a method at all.
    app.asgi_app = app.stream_routes  # type: ignore[method-assign,assignment]
    # Quart knows the paths served ahead of it only so that another method on one of them
    # gets Ollama's 405 with Allow (a POST never reaches this view).
    for path in [*app.stream_routes.paths, "/api/blobs/<digest>"]:
        app.add_url_rule(path, f"ahead {path}", served_ahead, methods=["POST"])
    app.asgi_app = EventsRoute(  # type: ignore[method-assign,assignment]
        app.asgi_app, scheduler, drain.stopping, origins, guard_hosts, allowed_host
    )

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        if isinstance(exc, MethodNotAllowed | NotFound):
            return routing_error(exc)
        return response_for(exc)

    @app.errorhandler(Exception)
    async def any_error(exc: Exception) -> Response:
        return response_for(exc)

    return app
