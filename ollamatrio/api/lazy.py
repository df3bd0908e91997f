"""The app, built when a request first needs it: the server answers at once.

Quart, its Flask and Werkzeug underneath, the dialects and the metrics library take about a
third of a second and 20 MiB to import, which a server that only answers ``/api/version`` (a
service manager's or a client's liveness check) never needs.  :class:`LazyApp` is the ASGI
app the front door serves from the start: until the real app exists it answers ``GET`` and
``HEAD`` of ``/`` and ``/api/version`` itself (Ollama's texts, the same CORS and Host checks
and access line as the app's), and the first other request builds the app (imported in a
worker thread, so the loop keeps answering meanwhile) and runs its lifespan; every request
after that goes to it.  The front door learns the streamed routes' paths and body limit from
here without importing them (:data:`STREAM_PATHS`).
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import TYPE_CHECKING, Any

import trio

from .._version import OLLAMA_API_VERSION, __version__
from ..config import Settings
from ..http.cors import OriginPolicy, cors_answer
from ..http.drain import Drain
from ..http.host_guard import allowed_host, is_loopback_bind
from ..wire import JSON_UTF8, json_bytes
from .requests import MAX_JSON_BODY

if TYPE_CHECKING:
    from ..scheduler import Scheduler
    from ..store import ModelStore

log = logging.getLogger(__name__)

# The paths api/routes.py serves ahead of Quart (all POST); a test holds the two equal.
STREAM_PATHS: tuple[str, ...] = (
    "/api/generate", "/api/chat", "/v1/completions", "/v1/chat/completions", "/v1/responses",
    "/v1/messages", "/v1/messages/count_tokens", "/api/pull", "/api/create",
)  # fmt: skip

_APP_MODULE = "ollamatrio.api.app"


def _liveness_answer(path: str) -> tuple[bytes, bytes] | None:
    """The body and content type of the two answers that need no app, or None."""
    if path == "/":
        return b"Ollama is running", b"text/plain; charset=utf-8"
    if path == "/api/version":
        body = json_bytes({"version": OLLAMA_API_VERSION, "ollamatrio": __version__})
        return body, JSON_UTF8.encode()
    return None


class _StreamRoutes:
    """The front door's view of the streamed routes (``http/front.py`` ``StreamRoutes``)."""

    def __init__(self, owner: LazyApp) -> None:
        self._owner = owner

    @property
    def paths(self) -> list[str]:
        return list(STREAM_PATHS)

    @property
    def body_limit(self) -> int:
        return MAX_JSON_BODY

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        app = await self._owner.app()
        await app.stream_routes(scope, receive, send)


class LazyApp:
    """ASGI: the liveness answers at once, everything else through the app built on first use."""

    def __init__(self, scheduler: Scheduler, store: ModelStore, settings: Settings) -> None:
        self._scheduler = scheduler
        self._store = store
        self._settings = settings
        self.drain = Drain()  # serve() cuts it when shutdown's grace period ends
        self.stream_routes = _StreamRoutes(self)
        self._origins = OriginPolicy.from_origins(settings.origins)
        self._guard_hosts = is_loopback_bind(settings.host)
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
            app = module.create_app(self._scheduler, self._store, self._settings, self.drain)
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
        if self._app is None and scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            answer = _liveness_answer(scope["path"])
            if answer is not None:
                await self._answer(scope, send, *answer)
                return
        app = await self.app()
        await app(scope, receive, send)

    async def _answer(self, scope: Any, send: Any, body: bytes, content_type: bytes) -> None:
        """A liveness answer as the app gives it: CORS first, then the Host guard."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        cors = cors_answer(headers.get("origin"), host, scope["method"], self._origins)
        status = cors.status
        if status is None and self._guard_hosts and not allowed_host(host):
            status = 403
        if status is not None:
            body, content_type = b"", b"text/html; charset=utf-8"
        extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in cors.headers]
        log.info("%s %s %d", scope["method"], scope["path"], status or 200,
                 extra={"client": (scope.get("client") or ("",))[0]})  # fmt: skip
        await send({
            "type": "http.response.start", "status": status or 200,
            "headers": [
                (b"content-type", content_type), (b"content-length", b"%d" % len(body)), *extra,
            ],
        })  # fmt: skip
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )
