"""Every piece of hypercorn's internals the front door (``http/front.py``) uses, in one place.

Hypercorn has no public API for serving a connection it did not accept, so the front door
repeats what ``hypercorn.trio.run.worker_serve`` sets up around its per-connection server
(``TCPServer``): the app wrapper, the lifespan and its state, the worker context, the
shutdown trigger.  None of that is public, and any hypercorn release may change it; so it is
all here, behind a narrow API, and ``tests/test_hypercorn_bridge.py`` checks the installed
hypercorn against :data:`INTERNALS` (every name this module uses, with the parameters it
passes) and against the versions ``pyproject.toml`` pins.  A hypercorn that fails that test
changed its internals: re-check this module against its ``trio/run.py`` before widening the
pin.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import h11
import trio
from hypercorn.config import Config
from hypercorn.events import Closed
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import AppWrapper, ConnectionState, LifespanState
from hypercorn.utils import ShutdownError, raise_shutdown, repr_socket_addr, wrap_app

__all__ = [
    "INTERNALS",
    "AppWrapper",
    "BodyWatch",
    "Config",
    "LifespanState",
    "ShutdownError",
    "WatchedStream",
    "Worker",
    "WorkerContext",
    "bind_name",
    "serve_connection",
    "shutdown_on",
]

# What this module relies on: "module:name" -> the parameters it passes (a callable's, in
# order, ``self`` left out), or None for a name that must only exist (a type, an exception).
# Attributes of instances are checked by the test on real ones (:data:`ATTRIBUTES`).
INTERNALS: dict[str, tuple[str, ...] | None] = {
    "hypercorn.trio.tcp_server:TCPServer": ("app", "config", "context", "state", "stream"),
    # run() takes a stream with do_handshake for TLS (front.TLSReplayStream).
    "hypercorn.trio.tcp_server:TCPServer.run": (),
    "hypercorn.trio.worker_context:WorkerContext": ("max_requests",),
    "hypercorn.trio.lifespan:Lifespan": ("app", "config", "state"),
    "hypercorn.trio.lifespan:Lifespan.handle_lifespan": ("task_status",),
    "hypercorn.trio.lifespan:Lifespan.wait_for_startup": (),
    "hypercorn.trio.lifespan:Lifespan.wait_for_shutdown": (),
    "hypercorn.trio.statsd:StatsdLogger": None,
    "hypercorn.config:Config.set_statsd_logger_class": ("statsd_logger",),
    "hypercorn.utils:wrap_app": ("app", "wsgi_max_body_size", "mode"),
    "hypercorn.utils:raise_shutdown": ("shutdown_event",),
    "hypercorn.utils:repr_socket_addr": ("family", "address"),
    "hypercorn.utils:ShutdownError": None,
    "hypercorn.typing:AppWrapper": None,
    "hypercorn.typing:ConnectionState": None,
    "hypercorn.typing:LifespanState": None,
    # HTTP/1.1 only (_HTTP1Server): TCPServer.run sets ``protocol`` to a ProtocolWrapper,
    # whose ``protocol`` is an H11Protocol with these and a ``send`` attribute.
    "hypercorn.protocol:ProtocolWrapper": None,
    "hypercorn.protocol.h11:H11Protocol._check_protocol": ("event",),
    "hypercorn.protocol.h11:H11Protocol._send_error_response": ("status_code",),
    "hypercorn.events:Closed": (),
}
# Attributes of a running ``TCPServer`` that :class:`BodyWatch` reads: the path to its
# HTTP/1.1 connection's h11 state, and the lock its writes hold.
ATTRIBUTES = ("TCPServer.protocol", "ProtocolWrapper.protocol", "H11Protocol.connection",
              "TCPServer.send_lock")  # fmt: skip


class Worker:
    """What ``worker_serve`` sets up for one server: the wrapped app (for hypercorn's
    connections), the lifespan and its state (copied into every connection's scope), and the
    worker context, whose ``terminate`` asks the server to stop and whose ``terminated`` tells
    hypercorn's connections that it has."""

    def __init__(self, app: Any, config: Config) -> None:
        self.config = config
        self.wrapped: AppWrapper = wrap_app(app, config.wsgi_max_body_size, "asgi")
        config.set_statsd_logger_class(StatsdLogger)
        self.state: LifespanState = {}
        self._lifespan = Lifespan(self.wrapped, config, self.state)
        self.context = WorkerContext(None)

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """The app's lifespan around the body: started up on entry, shut down when the body
        ends without an error (as ``worker_serve``)."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._lifespan.handle_lifespan)
            await self._lifespan.wait_for_startup()
            yield
            await self._lifespan.wait_for_shutdown()
            nursery.cancel_scope.cancel()

    async def until_terminate(self) -> None:
        """Raise :class:`ShutdownError` when the worker context asks the server to stop."""
        await raise_shutdown(self.context.terminate.wait)

    async def terminated(self) -> None:
        """Tell hypercorn's connections that the server is stopping (they close when idle)."""
        await self.context.terminated.set()


async def shutdown_on(trigger: Callable[..., Awaitable[None]]) -> None:
    """Raise :class:`ShutdownError` when ``trigger`` returns."""
    await raise_shutdown(trigger)


class BodyWatch:
    """Whether hypercorn's HTTP/1.1 connection (its h11 state) waits for a request body, and
    whether nothing of its answer has gone out yet.  Hypercorn has no body-read timeout of
    its own (its ``read_timeout`` would also cut a silent client waiting for a long
    stream), so the front door's stream keeps one while this says a body is being read."""

    def __init__(self, server: TCPServer) -> None:
        self._server = server

    def _h11(self) -> h11.Connection | None:
        wrapper = getattr(self._server, "protocol", None)  # set once the connection runs
        connection = getattr(getattr(wrapper, "protocol", None), "connection", None)
        return connection if isinstance(connection, h11.Connection) else None  # not h2, ws

    def reading_body(self) -> bool:
        connection = self._h11()
        return connection is not None and connection.their_state is h11.SEND_BODY

    def may_answer(self) -> bool:
        """No response has started (nor is any write of hypercorn's under way)."""
        connection = self._h11()
        return (
            connection is not None
            and connection.our_state is h11.SEND_RESPONSE
            and not self._server.send_lock.locked()
        )


class WatchedStream(trio.abc.HalfCloseableStream):
    """A stream that :func:`serve_connection` gives the :class:`BodyWatch` of the hypercorn
    connection it carries."""

    watch: BodyWatch | None = None


async def serve_connection(
    app: AppWrapper,
    config: Config,
    context: WorkerContext,
    state: LifespanState,
    stream: trio.abc.HalfCloseableStream,
) -> None:
    """Hypercorn's per-connection server, HTTP/1.1 only (:class:`_HTTP1Server`), on a
    connection accepted elsewhere, until it closes.  ``stream`` needs ``receive_some``,
    ``send_all``, ``send_eof``, ``aclose`` and a ``socket`` attribute; or, for a TLS
    connection whose handshake is done, ``do_handshake`` (nothing left to do),
    ``selected_alpn_protocol`` and a ``transport_stream`` with the ``socket``: ``TCPServer``
    tells TLS streams by ``do_handshake``, and its scope then says ``https``.  A
    :class:`WatchedStream` gets the connection's :class:`BodyWatch`."""
    server = _HTTP1Server(app, config, context, ConnectionState(state.copy()), stream)  # type: ignore[arg-type]
    if isinstance(stream, WatchedStream):
        stream.watch = BodyWatch(server)
    try:
        await server
    except* HTTP2Refused:
        pass  # answered 400 and closed


class HTTP2Refused(Exception):
    """A request on hypercorn's connection started HTTP/2: it was answered 400, and the
    connection closed."""


class _HTTP1Server(TCPServer):
    """Hypercorn's per-connection server, held to HTTP/1.1.

    Hypercorn switches a connection to its h2 protocol at a prior-knowledge preface (``PRI *
    HTTP/2.0``) or at an ``Upgrade: h2c`` request without a body, on any request of the
    connection, and has no setting against it; its h2 protocol can also be made to raise
    (``KeyError`` on a stream's DATA that comes after the answer).  Ollama's Go server
    speaks no h2c, and neither does this one: each connection's HTTP/1 protocol gets a
    check of its own (:func:`_http1_only`) before it reads a byte."""

    @property
    def protocol(self) -> ProtocolWrapper:
        return self._wrapper

    @protocol.setter
    def protocol(self, wrapper: ProtocolWrapper) -> None:
        # TCPServer.run makes the connection's ProtocolWrapper (HTTP/1: over TLS, ALPN
        # offers http/1.1 alone) and sets it here before the first read.
        self._wrapper = wrapper
        http1 = wrapper.protocol
        assert isinstance(http1, H11Protocol)
        http1._check_protocol = partial(_http1_only, http1)  # type: ignore[method-assign]


async def _http1_only(protocol: H11Protocol, event: h11.Request) -> None:
    """``H11Protocol._check_protocol`` (run on every request head) without the switches to
    h2: an h2c upgrade is ignored, the request served over HTTP/1.1 as Go's server serves it;
    the HTTP/2 preface is answered 400 and the connection closed."""
    if event.method == b"PRI" and event.target == b"*":
        await protocol._send_error_response(400)
        await protocol.send(Closed())
        raise HTTP2Refused()


def bind_name(sock: socket.socket) -> str:
    """A listening socket's address as hypercorn prints it (``127.0.0.1:11434``)."""
    return repr_socket_addr(sock.family, sock.getsockname())
