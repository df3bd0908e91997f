"""The Quart-Trio application: the views of the route table, the streamed routes ahead of
them, and the one request chain (:mod:`.chain`) around all of it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from ..auth.usage import UsageLedger, UsageStore
from ..config import Settings
from ..console import answer_console
from ..http.drain import Drain
from ..observability.events import EventsRoute
from ..observability.metrics import CONTENT_TYPE, ServerMetrics
from ..scheduler import Scheduler
from ..store import ModelStore
from .chain import Chain, allow_header, request_state
from .error_shapes import error_for_route
from .liveness import answer_liveness
from .models import ApiContext
from .native.handlers import OllamaApi
from .openai.handlers import OpenAiApi
from .responses.handlers import ResponsesApi, prune_forever
from .responses.store import FILE_NAME as RESPONSES_FILE
from .responses.store import ResponseStore
from .routes import StreamRoutes
from .table import ROUTES, BodyLimits, View, Views, Way, views_of
from .usage import KeyUsageSeries, UsageView, write_usage

log = logging.getLogger(__name__)

ASGIApp = Callable[..., Awaitable[None]]


class Router:
    """ASGI, inside the chain: each request to what serves its route (the table's
    :class:`~.table.Way`); a request no route answers goes to Quart, which answers Gin's
    404 or 405."""

    def __init__(self, views: ASGIApp, streams: StreamRoutes, events: EventsRoute) -> None:
        self.views = views
        self._ways: dict[Way, ASGIApp] = {
            Way.LIVENESS: lambda scope, receive, send: answer_liveness(scope, send),
            Way.STREAM: streams,
            Way.EVENTS: events,
            Way.CONSOLE: lambda scope, receive, send: answer_console(scope, send),
        }

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            route = request_state(scope).route
            if route is not None and route.way is not Way.VIEW:
                await self._ways[route.way](scope, receive, send)
                return
        await self.views(scope, receive, send)


class _App(QuartTrio):
    def __init__(self, *args: Any, drain: Drain | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drain = drain or Drain()  # serve() cuts it when shutdown's grace period ends
        self.body_limits = BodyLimits()  # what the front door limits before reading
        self.ctx: ApiContext | None = None
        # The routes inside the chain: the lazy app (api/lazy.py) sends requests here
        # through its own chain.  Set by create_app.
        self.dispatch: ASGIApp | None = None


def routing_error(exc: MethodNotAllowed | NotFound) -> Response:
    """Gin's plain-text answers to an unknown path (404) and a known path asked with
    another method (405, with ``Allow``), on every route as in Ollama (its
    ``server/routes.go`` sets ``r.HandleMethodNotAllowed = true``)."""
    text = "405 method not allowed" if isinstance(exc, MethodNotAllowed) else "404 page not found"
    headers = {}
    if isinstance(exc, MethodNotAllowed):
        headers["Allow"] = allow_header(request.path)
    return Response(text, status=exc.code or 404, content_type="text/plain", headers=headers)


async def served_elsewhere() -> Response:
    raise RuntimeError("a route the router serves reached Quart")


def drain_of(app: QuartTrio) -> Drain:
    """The app's :class:`Drain` (``create_app`` made the app)."""
    assert isinstance(app, _App)
    return app.drain


def register_views(app: QuartTrio, views: Views) -> None:
    """Each view route of the table, from the dialects' ``views``; Quart also knows the
    paths served elsewhere (liveness, streams), so that another method on one of them gets
    Gin's 405 with ``Allow``.  A view the table does not list, or a view route of the table
    with no view, is refused."""
    wanted = {(r.path, m) for r in ROUTES if r.way is Way.VIEW for m in r.methods}
    if wanted != set(views):
        raise RuntimeError(
            f"views and the route table differ: not in the table {sorted(set(views) - wanted)},"
            f" without a view {sorted(wanted - set(views))}"
        )
    for route in ROUTES:
        if route.way is Way.EVENTS:
            continue  # Ollama has no /api/events: another method on it is a plain 404
        by_view: dict[View, list[str]] = {}
        for method in sorted(route.methods):
            view = views[route.path, method] if route.way is Way.VIEW else served_elsewhere
            by_view.setdefault(view, []).append(method)
        for view, methods in by_view.items():
            endpoint = f"{route.dialect}_{getattr(view, '__name__', 'view')}_{route.path}"
            app.add_url_rule(route.path, f"{endpoint}_{'_'.join(methods)}", view, methods=methods)


def create_app(
    scheduler: Scheduler, store: ModelStore, settings: Settings, drain: Drain | None = None,
    usage: UsageLedger | None = None,
) -> QuartTrio:  # fmt: skip
    """The app; ``drain`` is the one shutdown cuts (default: a new one, see :func:`drain_of`),
    ``usage`` the ledger the request chain records each key's usage in (default: a new one;
    the lazy app passes its own chain's)."""
    # An explicit root: Quart would look it up from the package's __file__, which is None
    # when a folder named ollamatrio/ in the working directory shadows an editable install.
    app = _App("ollamatrio", root_path=str(Path(__file__).resolve().parent), drain=drain)
    app.config.update(
        RESPONSE_TIMEOUT=None,  # Quart's 60 s default would cut long generations silently
        BODY_TIMEOUT=None,  # blob uploads take as long as they take
        MAX_CONTENT_LENGTH=None,  # JSON bodies are limited when read (requests.read_json)
        PROVIDE_AUTOMATIC_OPTIONS=False,  # preflights are answered by the chain
    )
    metrics = ServerMetrics(scheduler)
    responses = ResponseStore(settings.state_dir / RESPONSES_FILE, settings.responses_ttl)
    ctx = ApiContext(
        scheduler=scheduler, store=store, settings=settings, metrics=metrics, responses=responses
    )
    app.ctx = ctx
    ledger = usage if usage is not None else UsageLedger()
    usage_store = UsageStore.in_folder(settings.state_dir)
    usage_view = UsageView(ledger, usage_store)
    metrics.registry.register(KeyUsageSeries(ledger))
    app.extensions["ollamatrio"] = ctx

    async def prometheus_metrics() -> Response:
        return Response(await metrics.render(), content_type=CONTENT_TYPE)

    register_views(app, {
        **OllamaApi(ctx).views(),
        **OpenAiApi(ctx).views(),
        **ResponsesApi(responses).views(),
        **views_of(
            ("GET", "/metrics", prometheus_metrics), ("GET", "/api/usage", usage_view.usage)
        ),
    })  # fmt: skip

    @app.before_serving
    async def prune_stored_responses() -> None:
        app.nursery.start_soon(prune_forever, responses)
        app.nursery.start_soon(write_usage, ledger, usage_store)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        if isinstance(exc, MethodNotAllowed | NotFound):
            return routing_error(exc)
        return error_for_route(request.path, exc)

    @app.errorhandler(Exception)
    async def any_error(exc: Exception) -> Response:
        return error_for_route(request.path, exc)

    # Pulls run in the app's nursery, which Quart opens at startup.
    streams = StreamRoutes(ctx, lambda: app.nursery)
    events = EventsRoute(scheduler, app.drain.stopping)
    # Quart types asgi_app with hypercorn's scope and event types; these apps take plain
    # dicts, and mypy refuses assigning to a method at all.
    app.dispatch = Router(app.asgi_app, streams, events)
    app.asgi_app = Chain(  # type: ignore[method-assign,assignment]
        app.dispatch, settings, app.drain, lambda: metrics, ledger
    )
    return app
