"""The HTTP front door: every simple HTTP/1.1 request on raw Trio, anything else on hypercorn.

Hypercorn costs about half of a relayed token's CPU (each ASGI send goes through its h11
framing, a per-connection lock and a shielded cancel scope) and most of the time to the
first token, so the server accepts connections itself and serves their requests, one after
another on the same keep-alive connection, with ASGI ``receive``/``send`` callables that cost
one ``send_all`` per body piece (``http/asgi.py``).  A plain request over HTTP/1.1 with a
``Content-Length`` or chunked body (or none), or over HTTP/1.0 (closed after its answer, as
h11 does), is served here whatever its route, by the same app hypercorn runs, with the scope
hypercorn would build; the bodies the app names (the generations and progress streams,
:class:`BodyLimits`) are limited before they are read.
So the official clients, which call ``/api/show`` or ``/api/tags`` on the connection they
chat on, keep the cheap path for their generations.

At the first request that is not simple (an upgrade, a transfer coding other than chunked,
an oversized or unusual head, requests pipelined behind the one being served), the whole
connection is handed to hypercorn's own per-connection server, the bytes already read
replayed first; it stays there until it closes (held to the front door's body and send
deadlines, :class:`ReplayStream`).  Hypercorn has no public API for serving a connection it
did not accept, so :func:`serve_http` repeats ``hypercorn.trio.run.worker_serve`` (lifespan,
worker context, shutdown trigger, graceful timeout) around its ``TCPServer``; every
hypercorn internal that takes is in ``http/hypercorn_bridge.py``, checked by a test against
the hypercorn versions ``pyproject.toml`` pins.

With ``OLLAMATRIO_TLS_CERT``/``_KEY`` the listener speaks HTTPS alone (``http/tls.py``):
each connection's handshake runs in its own task, then everything above is the same over
the :class:`trio.SSLStream`, except that a write always goes through the stream (it must be
encrypted: no direct ``os.write``), a connection over the cap is closed rather than answered
503, and a stalled body on a handed-over connection is closed without its 408.  A handed-over
connection reaches hypercorn as a TLS stream whose handshake is done
(:class:`TLSReplayStream`), so its scope says ``https`` as the front door's does.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import ssl
import traceback
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import trio

from ..config import DEFAULT_BODY_TIMEOUT
from .accept import serve_listeners
from .asgi import ASGIApp, Exchange
from .budget import ConnectionBudget, default_cap, refuse, soft_file_limit
from .host_guard import head_problem
from .http1 import (
    HANDOFF,
    MAX_HEAD,
    BadRequest,
    Head,
    content_length,
    head_end,
    parse_request,
    response_head,
)
from .hypercorn_bridge import (
    AppWrapper,
    BodyWatch,
    Config,
    LifespanState,
    ShutdownError,
    WatchedStream,
    Worker,
    WorkerContext,
    bind_name,
    serve_connection,
    shutdown_on,
)
from .tls import handshake

log = logging.getLogger(__name__)

RECEIVE_SIZE = 64 * 1024
# A response piece is never cut half-way (the framing would break): a client that takes more
# than this to accept the rest of one is dropped.
SEND_TIMEOUT = 30.0
LINGER = 2.0  # seconds a closing connection reads what the client still sends (close())
_HANDOFF = object()
_TEXT = [(b"content-type", b"text/plain; charset=utf-8")]
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\n"  # how an HTTP/2 client with prior knowledge starts


def log_connection_error(error: BaseException, client: str) -> None:
    """One line for an error that ended a connection: what and where it was raised, so that a
    client repeating it cannot flood the log; the traceback only with debug logging."""
    leaf = error
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    frames = traceback.extract_tb(leaf.__traceback__)
    where = (
        f" at {'/'.join(Path(frames[-1].filename).parts[-2:])}:{frames[-1].lineno}"
        if frames
        else ""
    )
    log.error(
        "closed a client connection after an error: %s: %s%s", type(leaf).__name__, leaf, where,
        extra={"client": client}, exc_info=error if log.isEnabledFor(logging.DEBUG) else None,
    )  # fmt: skip


class HeadGuard:
    """ASGI: the app behind a check of the head (:func:`~.host_guard.head_problem`), for
    hypercorn's connections, as the front door checks its own: a second ``Host`` or
    ``Origin``, or a ``Host`` that is no host name, is answered 400 before any route."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        problem = None
        if scope["type"] in ("http", "websocket"):
            problem = head_problem(scope["headers"])
        if problem is None:
            await self.app(scope, receive, send)
            return
        log.info(
            "%s %s 400 %s", scope.get("method", "GET"), scope["path"], problem,
            extra={"client": (scope.get("client") or ("",))[0]},
        )  # fmt: skip
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1002})  # hypercorn answers 403
            return
        # No "connection: close": h11 has read the request whole, so the connection may go
        # on (and hypercorn would close it before the body, with a request pipelined behind).
        text = problem.encode()
        await send({
            "type": "http.response.start", "status": 400,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", b"%d" % len(text)),
            ],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": text})


class BodyLimits(Protocol):
    """Which request bodies an app wants limited before they are read: a ``POST`` to one of
    ``paths`` (the streamed JSON routes, ``api/table.py``) is refused past ``body_limit``
    bytes on its ``Content-Length``, and its head is deferred to the first body piece.  An
    app offers them as its ``body_limits`` attribute."""

    @property
    def paths(self) -> list[str]: ...

    @property
    def body_limit(self) -> int: ...


def body_limits_of(app: Any) -> BodyLimits | None:
    limits: BodyLimits | None = getattr(app, "body_limits", None)
    return limits


class ReplayStream(WatchedStream):
    """A client connection whose first bytes were already read: they come first again.
    (``TCPServer`` uses ``receive_some``, ``send_all``, ``send_eof``, ``aclose`` and
    ``.socket``.)

    It also holds hypercorn's connections to the front door's deadlines, which hypercorn
    lacks: a request body that sends nothing for ``body_timeout`` is answered ``408`` (if no
    response has started) and closed; a write the client does not take within
    ``SEND_TIMEOUT`` closes the connection (hypercorn then tells the app that the client
    left, which frees a generation's slot).  And it closes even when hypercorn's close runs
    in a cancelled scope (its ``send_eof`` would raise ``Cancelled`` before ``aclose``, and a
    ``Connection: close`` answer would never be followed by a close)."""

    def __init__(
        self, stream: trio.SocketStream, prefix: bytes, body_timeout: float = math.inf
    ) -> None:
        self.transport: trio.abc.Stream = stream
        self.plain = True  # a write straight to the socket is a write to the client
        self.socket = stream.socket
        self._prefix = prefix
        self.body_timeout = body_timeout
        self.watch: BodyWatch | None = None  # set by serve_connection: hypercorn's h11 state
        self.timed_out = False  # closed for a stalled body or a client that stopped reading

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            await trio.lowlevel.checkpoint()
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            return data
        if self.watch is None or not self.watch.reading_body():
            return await self.transport.receive_some(max_bytes)
        with trio.move_on_after(self.body_timeout):
            return await self.transport.receive_some(max_bytes)
        # No byte of the body for body_timeout: 408 if nothing of an answer has gone out
        # (one write that cannot wait: hypercorn's own writes hold its send lock), then close.
        if self.plain and self.watch.may_answer():
            text = b"request body timed out: no byte for %gs" % self.body_timeout
            with contextlib.suppress(OSError):
                os.write(
                    self.socket.fileno(),
                    response_head(408, [], content_length(len(text)), close=True) + text,
                )
        log.info("a request body on a connection served by hypercorn stalled: closed")
        await self._close_for_timeout()
        raise trio.ClosedResourceError("the request body stalled")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        # Hypercorn shields its writes; a deadline inside the shield still holds.
        with trio.move_on_after(SEND_TIMEOUT):
            await self.transport.send_all(data)
            return
        await self._close_for_timeout()
        raise trio.BrokenResourceError("the client took no data for SEND_TIMEOUT")

    async def _close_for_timeout(self) -> None:
        self.timed_out = True
        with trio.CancelScope(shield=True):
            await self.transport.aclose()  # wakes hypercorn's reader: it sees the close

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        assert isinstance(self.transport, trio.abc.HalfCloseableStream)
        with trio.CancelScope(shield=True):  # shutdown(SHUT_WR): never waits
            await self.transport.send_eof()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):  # closing never waits
            await self.transport.aclose()


class TLSReplayStream(ReplayStream):
    """A :class:`ReplayStream` over a TLS connection whose handshake the front door did.

    Hypercorn's ``TCPServer.run`` takes a stream with ``do_handshake`` for a TLS one: it
    calls it (nothing left to do here), asks ``selected_alpn_protocol`` and reads the socket
    from ``transport_stream``; the scope then says ``https``.  A stalled body is closed
    without the 408 (a write of ours beside hypercorn's would break the TLS records), and
    there is no half-close (TLS has none; hypercorn closes next)."""

    def __init__(
        self, stream: trio.SSLStream[trio.SocketStream], prefix: bytes,
        body_timeout: float = math.inf,
    ) -> None:  # fmt: skip
        super().__init__(stream.transport_stream, prefix, body_timeout)
        self.transport = stream
        self.transport_stream = stream.transport_stream
        self.plain = False

    async def do_handshake(self) -> None:
        await trio.lowlevel.checkpoint()

    def selected_alpn_protocol(self) -> str:
        return "http/1.1"  # the only protocol offered (http/tls.py)

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()


class Front:
    """What the connections share: the apps, the connection budget, and whether shutdown has
    begun."""

    def __init__(
        self, app: ASGIApp, wrapped: AppWrapper, limits: BodyLimits | None,
        config: Config, context: WorkerContext, state: LifespanState,
        budget: ConnectionBudget | None = None, body_timeout: float = DEFAULT_BODY_TIMEOUT,
        tls: ssl.SSLContext | None = None,
    ) -> None:  # fmt: skip
        self.app = app  # what hypercorn's wrapper calls (the same callable, the same scope)
        self.wrapped = wrapped  # for hypercorn
        self.limits = limits
        self.paths = frozenset(p.encode() for p in limits.paths) if limits else frozenset()
        self.config = config
        self.context = context
        self.state = state
        self.stopping = False
        self.handoffs = 0  # connections handed to hypercorn (tests and logs look)
        self.budget = budget or ConnectionBudget(default_cap(soft_file_limit()))
        # Seconds a request body may go without a byte (OLLAMATRIO_BODY_TIMEOUT).
        self.body_timeout = body_timeout
        self.tls = tls  # HTTPS: every connection's handshake first (http/tls.py)

    def stop(self) -> None:
        """Read no more requests; close the connections waiting for one."""
        self.stopping = True
        self.budget.close_idle()

    async def accept(self, stream: trio.SocketStream) -> None:
        """One accepted connection: served while it holds a place in the budget (closing the
        oldest idle connection to make one if need be), else answered 503 at once.

        The boundary of every connection: whatever its handler raises (the front door's code,
        hypercorn's, an app's that escaped them) is logged in one line and closes this
        connection; it never reaches the listener's nursery, which would end the server."""
        try:
            client = stream.socket.getpeername()[0]  # for the log: closed, it has no peer
        except OSError:
            client = ""
        try:
            async with self.budget.place(stream) as admitted:
                if admitted and self.tls is not None:
                    await self.handle_tls(stream, self.tls)
                elif admitted:
                    await self.handle(stream)
                elif self.tls is None:
                    await refuse(stream)
                else:  # a 503 would cost a handshake to a client that cannot be served
                    await trio.aclose_forcefully(stream)
        except* Exception as group:  # Cancelled (shutdown) is no Exception: it goes on
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            log_connection_error(group, client)

    async def handle_tls(self, stream: trio.SocketStream, context: ssl.SSLContext) -> None:
        """One accepted connection on the HTTPS listener: its handshake (in this task, with
        a deadline), then served as :meth:`handle` serves a plain one."""
        secure = await handshake(stream, context)
        if secure is None:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            return
        await self.handle(secure)

    async def handle(self, stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]) -> None:
        """One accepted connection (after its handshake, on HTTPS), for as long as it lives."""
        transport = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        try:
            connection = _Connection(self, stream, transport)
        except OSError:  # the client is already gone (getpeername)
            with trio.CancelScope(shield=True):
                await stream.aclose()
            return
        try:
            handoff = await connection.serve()
        finally:
            if not connection.handed_off:
                await connection.close()
        if handoff:
            self.handoffs += 1
            prefix = bytes(connection.buffer)
            replay = (
                TLSReplayStream(stream, prefix, self.body_timeout)
                if isinstance(stream, trio.SSLStream)
                else ReplayStream(stream, prefix, self.body_timeout)
            )
            try:
                await serve_connection(self.wrapped, self.config, self.context, self.state, replay)
            finally:
                # Hypercorn closes it, unless its close was cut short: then this does.
                self.budget.leaving(transport)
                await replay.aclose()

    def idle(self) -> trio.CancelScope:
        """A scope for waiting on the next request: keep-alive timeout, or shutdown."""
        scope = trio.CancelScope(relative_deadline=self.config.keep_alive_timeout)
        if self.stopping:
            scope.cancel()
        return scope


class _Connection:
    """A client connection served by the front door, one exchange at a time."""

    def __init__(self, front: Front, stream: trio.abc.Stream, transport: trio.SocketStream) -> None:
        self.front = front
        self.stream = stream  # the transport itself, or TLS over it
        self.transport = transport  # the TCP connection (its place in the budget)
        self.buffer = bytearray()
        self.handed_off = False
        self.eof = False  # the client closed its side (or the connection broke)
        self.broken = False  # a write failed: nothing more can be written
        # We answered without reading all the client sent: closing at once could reset the
        # connection (unread data) before the client reads the answer (see close()).
        self.linger = False
        # For writes that need not wait (see write()); over TLS every write is encrypted by
        # the stream, so there is none.
        self.fd = transport.socket.fileno() if stream is transport else None
        self.scheme = "http" if stream is transport else "https"
        peer = transport.socket.getpeername()
        self.client = (peer[0], peer[1])
        here = transport.socket.getsockname()
        self.server = (here[0], here[1])

    @property
    def root_path(self) -> str:
        return str(self.front.config.root_path)

    @property
    def state(self) -> dict[str, Any]:
        return self.front.state

    @property
    def stopping(self) -> bool:
        return self.front.stopping

    @property
    def body_timeout(self) -> float:
        return self.front.body_timeout

    async def serve(self) -> bool:
        """Exchanges until the connection should close (False) or go to hypercorn (True)."""
        while True:
            head = await self._next_head()
            if head is None:
                return False
            if head is _HANDOFF:
                self.handed_off = True
                return True
            assert isinstance(head, Head)
            problem = head_problem(head.headers)
            if problem is not None:  # before any route reads the head
                path = head.target.partition(b"?")[0].decode("ascii")
                await self.refuse(f"{head.method} {path}", problem)
                return False
            front = self.front
            # The path without its query: Claude Code posts to /v1/messages?beta=true.
            if head.method == "POST" and head.target.partition(b"?")[0] in front.paths:
                # A generation or a progress stream: its JSON body limited before reading.
                assert front.limits is not None
                exchange = Exchange(self, head, limit=front.limits.body_limit, defer_head=True)
            else:
                exchange = Exchange(self, head)
            await exchange.run(front.app)
            if not exchange.keep_alive() or self.eof or self.broken:
                return False

    async def _next_head(self) -> Head | object | None:
        """The next request's head (its bytes consumed from the buffer), ``_HANDOFF``, or
        None: the client left, the keep-alive timeout passed, or shutdown began."""
        if self.front.stopping:
            return None
        with self.front.idle() as scope, self.front.budget.idle(scope):
            end = await self._read_until_head()
        # Cancelled (timeout, shutdown, or closed to make room) even if a head came in.
        if scope.cancel_called or end is None:
            return None
        if end == HANDOFF:
            return _HANDOFF
        if self.buffer.startswith(HTTP2_PREFACE):
            # HTTP/2 with prior knowledge: not on this listener (nor hypercorn's h2).
            await self.refuse("PRI *", "HTTP/2 is not supported")
            return None
        try:
            head = parse_request(self.buffer, end)
        except BadRequest as exc:
            await self.refuse(None, str(exc))
            return None
        if head is None:
            return _HANDOFF  # not simple, or pipelined requests: hypercorn's
        del self.buffer[:end]
        return head

    async def refuse(self, request: str | None, reason: str) -> None:
        """Answer 400 with ``reason`` and close (after lingering: the request is unread); a
        refused ``request`` (method and path) is logged in one line."""
        if request is not None:
            log.info("%s 400 %s", request, reason, extra={"client": self.client[0]})
        text = reason.encode()
        head = response_head(400, _TEXT, content_length(len(text)), close=True)
        await self.write(head + text)
        self.linger = True

    async def _read_until_head(self) -> int | None:
        """Where the buffered head ends (past its blank line); ``HANDOFF`` if the request is
        not one of ours; None at EOF."""
        start = 0
        while True:
            end = head_end(self.buffer, start)
            if end is not None:
                return end
            start = max(0, len(self.buffer) - 2)
            await self.receive()
            if self.eof:
                return None

    async def receive(self) -> None:
        """Read what the client sent next into the buffer (or note that it left)."""
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if data:
            self.buffer += data
        else:
            self.eof = True

    async def wait_for_eof(self) -> None:
        """Until the client leaves; what it sends meanwhile (the next request) is kept."""
        while not self.eof:
            if len(self.buffer) > MAX_HEAD:
                await trio.sleep_forever()  # it is sending more than one head: wait for us
            await self.receive()

    async def close(self) -> None:
        """Close; after an answer that left part of the request unread, say so first (FIN)
        and read what the client still sends for a while, so that the kernel does not reset
        the connection before the client has read the answer."""
        with trio.CancelScope(shield=True):
            if self.linger and not (self.eof or self.broken):
                with (
                    trio.move_on_after(LINGER),
                    contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
                ):
                    if isinstance(self.stream, trio.abc.HalfCloseableStream):
                        await self.stream.send_eof()  # (TLS has no half-close)
                    while await self.stream.receive_some(RECEIVE_SIZE):
                        pass
            self.front.budget.leaving(self.transport)
            await self.stream.aclose()

    async def write(self, data: bytes) -> None:
        """Send ``data`` whole, or mark the connection broken.

        The common case is one non-blocking ``write`` that takes everything: no trio
        checkpoint, so no extra trip through the scheduler per token, and nothing that a
        cancellation could cut half-way.  Only a full socket buffer waits; then the rest is
        shielded (a cut piece would break the framing) but bounded (``SEND_TIMEOUT``)."""
        if self.broken:
            return
        try:
            sent = 0 if self.fd is None else os.write(self.fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.broken = True
            return
        if sent == len(data):
            return
        with trio.CancelScope(shield=True, relative_deadline=SEND_TIMEOUT) as scope:
            try:
                await self.stream.send_all(memoryview(data)[sent:])
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.broken = True
        if scope.cancelled_caught:
            self.broken = True


async def serve_http(
    app: Any,
    config: Config,
    *,
    shutdown_trigger: Callable[..., Awaitable[None]] | None = None,
    budget: ConnectionBudget | None = None,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    tls: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` (an ASGI app; a :func:`create_app` app gets the front door for its
    generation routes) as ``hypercorn.trio.serve`` does: until ``shutdown_trigger`` returns,
    then running requests get ``config.graceful_timeout`` to finish.  ``budget`` caps the
    client connections held at once (default: from the open file limit, ``http/budget.py``);
    a request body that sends no byte for ``body_timeout`` seconds is answered 408.  With
    ``tls`` (``http/tls.py``) every listener speaks HTTPS alone."""
    worker = Worker(HeadGuard(app), config)  # the front door checks its own heads
    front = Front(
        app, worker.wrapped, body_limits_of(app), config, worker.context, worker.state, budget,
        body_timeout, tls,
    )  # fmt: skip
    async with worker.lifespan():
        async with trio.open_nursery() as server_nursery:
            sockets = config.create_sockets()
            assert not sockets.secure_sockets, "plain HTTP only"
            assert not sockets.quic_sockets, "plain HTTP only"
            listeners = []
            binds = []
            for sock in sockets.insecure_sockets:
                sock.listen(config.backlog)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
                binds.append(f"{'https' if tls else 'http'}://{bind_name(sock)}")
            task_status.started(binds)
            try:
                async with trio.open_nursery() as nursery:
                    if shutdown_trigger is not None:
                        nursery.start_soon(shutdown_on, shutdown_trigger)
                    nursery.start_soon(worker.until_terminate)
                    nursery.start_soon(
                        partial(
                            serve_listeners,
                            front.accept,
                            listeners,
                            handler_nursery=server_nursery,
                            freed=front.budget.wait_changed,
                        )
                    )
            except BaseExceptionGroup as error:
                _, others = error.split((ShutdownError, KeyboardInterrupt))
                if others is not None:
                    raise others from None
            finally:
                front.stop()
                await worker.terminated()
                server_nursery.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
