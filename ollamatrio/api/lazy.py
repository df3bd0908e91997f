"""The app, built when a request first needs it: the server answers at once.

Quart, its Flask and Werkzeug underneath, the dialects and the metrics library take about a
third of a second and 20 MiB to import, which a server that only answers ``/api/version`` (a
service manager's or a client's liveness check) never needs.  :class:`LazyApp` is the ASGI
app the front door serves from the start: the liveness routes are answered at once
(:mod:`.liveness`), and the first other request builds the app (imported in a worker
thread, so the loop keeps answering meanwhile) and runs its lifespan; every request after
that goes to its routes.  Every request, before or after, goes through the same request
chain (:mod:`.chain`) as the app's own; the front door learns which bodies to limit from the
route table (:mod:`.table`), which imports no framework.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import TYPE_CHECKING, Any

import trio

from ..config import Settings
from ..console import answer_console
from ..http.drain import Drain
from .chain import Chain, request_state
from .liveness import answer_liveness
from .table import BodyLimits, Way

if TYPE_CHECKING:
    from ..observability.metrics import ServerMetrics
    from ..scheduler import Scheduler
    from ..store import ModelStore

log = logging.getLogger(__name__)

_APP_MODULE = "ollamatrio.api.app"


class LazyApp:
    """ASGI: the liveness answers at once, everything else through the app built on first use."""

    def __init__(self, scheduler: Scheduler, store: ModelStore, settings: Settings) -> None:
        self._scheduler = scheduler
        self._store = store
        self._settings = settings
        self.drain = Drain()  # serve() cuts it when shutdown's grace period ends
        self.body_limits = BodyLimits()  # what the front door limits before reading
        self._chain = Chain(self._dispatch, settings, self.drain, self._metrics)
        self._app: Any = None
        self._built: trio.Event | None = None
        self._error: BaseException | None = None
        self._lifespan_scope: dict[str, Any] | None = None
        self._nursery: trio.Nursery | None = None  # the lifespan's: the app's lifespan runs there
        self._app_lifespan: tuple[Any, Any] | None = None  # (send to it, receive from it)

    @property
    def built(self) -> bool:
        return self._app is not None

    async def app(self) -> Any:
        """The real app, built by the first caller (the others wait for it)."""
        if self._app is not None:
            return self._app
        if self._built is None:
            self._built = trio.Event()
            if self._nursery is not None:  # a cancelled request must not cancel the build
                self._nursery.start_soon(self._build)
            else:
                await self._build()
        await self._built.wait()
        if self._app is None:
            raise RuntimeError("the API app could not be built") from self._error
        return self._app

    async def _build(self) -> None:
        assert self._built is not None
        try:
            started = trio.current_time()
            # In a worker thread: the loop goes on answering while Quart loads (a process
            # that has it already, tests, skips the thread).
            module = sys.modules.get(_APP_MODULE)
            if module is None:
                module = await trio.to_thread.run_sync(importlib.import_module, _APP_MODULE)
            app = module.create_app(
                self._scheduler, self._store, self._settings, self.drain, self._chain.usage
            )
            if self._nursery is not None:
                await self._start_lifespan(app)
            self._app = app
            log.debug("API app built in %.3f s", trio.current_time() - started)
        except Exception as exc:
            log.exception("the API app could not be built")
            self._error = exc
        finally:
            self._built.set()

    async def _start_lifespan(self, app: Any) -> None:
        """Run the app's lifespan in ours, up to its startup's end."""
        assert self._nursery is not None
        assert self._lifespan_scope is not None
        to_app, app_receives = trio.open_memory_channel[dict[str, Any]](1)
        app_sends, from_app = trio.open_memory_channel[dict[str, Any]](1)
        self._nursery.start_soon(app, self._lifespan_scope, app_receives.receive, app_sends.send)
        await to_app.send({"type": "lifespan.startup"})
        answer = await from_app.receive()
        if answer["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the API app's startup failed: {answer.get('message')}")
        self._app_lifespan = (to_app, from_app)

    async def _lifespan(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self._lifespan_scope = scope
        await receive()  # lifespan.startup
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            if self._app_lifespan is not None:
                to_app, from_app = self._app_lifespan
                await to_app.send({"type": "lifespan.shutdown"})
                await from_app.receive()
            nursery.cancel_scope.cancel()
        await send({"type": "lifespan.shutdown.complete"})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        await self._chain(scope, receive, send)

    async def _dispatch(self, scope: Any, receive: Any, send: Any) -> None:
        """Inside the chain: a liveness route or the console's files at once, anything else
        to the app's routes."""
        route = request_state(scope).route
        if route is not None and route.way is Way.LIVENESS:
            await answer_liveness(scope, send)
            return
        if route is not None and route.way is Way.CONSOLE:
            await answer_console(scope, send)
            return
        app = await self.app()
        await app.dispatch(scope, receive, send)

    def _metrics(self) -> ServerMetrics | None:
        """The app's request metrics, once it exists (requests before are not counted)."""
        return None if self._app is None else self._app.ctx.metrics
