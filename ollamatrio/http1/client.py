"""An HTTP/1.1 client on raw Trio streams, with a keep-alive pool: to a runner's llama.cpp
server over its Unix socket (``engines/runner_http.py``) and from the fleet's gateway to a
host over TCP (``fleet/gateway_upstream.py``).  How a connection is opened is the caller's
(:data:`Connect`); everything after is the same.

A request takes an idle pooled connection when one is fresh enough, else a new one; after a
complete response the connection goes back to the pool.  A pooled connection the peer closed
while idle fails before any response byte arrives; such a request is sent once more on a
fresh connection (the peer processed nothing).  A response that is abandoned half-way
closes its connection: that is how the peer learns that its client went away.

Bodies are read as they arrive, one read per wake-up (:class:`BodyReader`): to the length
the head gives, in chunks (:class:`~ollamatrio.http1.framing.ChunkedDecoder`), or to the
close.  Every failure below HTTP (an ``OSError``, a broken or closed stream, bytes that are
not HTTP/1.1) becomes a :class:`~ollamatrio.errors.PeerConnectionError` in one place,
:class:`TransportErrors`, in the manner of httpx's ``map_exceptions``.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Final

import trio

from ..errors import PeerConnectionError
from .framing import ChunkedDecoder, FramingError, ResponseHead, parse_response_head

MAX_HEAD: Final = 64 * 1024  # status line and headers
RECEIVE_SIZE: Final = 65536

#: Opens a new connection to the peer (``trio.open_unix_socket``, ``trio.open_tcp_stream``).
Connect = Callable[[], Awaitable[trio.SocketStream]]


async def receive_some(stream: trio.SocketStream, *, drained: bool) -> bytes:
    """The next bytes on ``stream`` (``b""`` at its end): one wait for data (the scheduler
    trip per token) and one ``read``, the fewest system calls a streamed token can take.
    ``drained``: the last read did not fill its buffer, so the socket is most likely empty
    and the wait comes first instead of a read that would fail.

    Raises:
        OSError, trio.ClosedResourceError: the connection failed.
    """
    sock = stream.socket
    if drained:
        await trio.lowlevel.wait_readable(sock)
    else:
        await trio.lowlevel.checkpoint()
    while True:
        try:
            return os.read(sock.fileno(), RECEIVE_SIZE)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(sock)


class TransportErrors:
    """The one translation of a connection's low-level failures (an ``OSError``, a broken
    or closed stream, bytes that are not HTTP/1.1): they leave its ``with`` block as a
    :class:`~ollamatrio.errors.PeerConnectionError` naming the peer, as httpx's
    ``map_exceptions`` does.  A class, not a generator: it wraps every read of a stream."""

    __slots__ = ("peer",)

    def __init__(self, peer: str) -> None:
        self.peer = peer  # as the messages name it: "the runner", "the host"

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        if isinstance(exc, OSError | trio.BrokenResourceError | trio.ClosedResourceError):
            raise PeerConnectionError(f"connection to {self.peer} failed: {exc}") from exc
        if isinstance(exc, FramingError):
            raise PeerConnectionError(f"{exc} from {self.peer}") from exc


class Connection:
    """One connection to the peer, and what was received on it but not yet consumed."""

    def __init__(self, stream: trio.SocketStream, peer: str) -> None:
        self.stream = stream
        self.peer = peer
        self.errors = TransportErrors(peer)
        self.buffer = bytearray()  # received, not yet consumed
        self.idle_since = 0.0
        self.received_any = False
        self._drained = False  # the last read did not fill the buffer: wait before reading

    async def send_all(self, data: bytes) -> None:
        with self.errors:
            await self.stream.send_all(data)

    async def receive(self) -> bytes:
        """The next bytes from the peer (``b""`` at the connection's end)."""
        with self.errors:
            data = await receive_some(self.stream, drained=self._drained)
        self._drained = len(data) < RECEIVE_SIZE
        if data:
            self.received_any = True
        return data

    async def read_head(self) -> ResponseHead:
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self.buffer) > MAX_HEAD:
                raise PeerConnectionError(f"{self.peer} sent an oversized response head")
            data = await self.receive()
            if not data:
                raise PeerConnectionError(f"{self.peer} closed the connection")
            self.buffer += data
        raw = bytes(self.buffer[:end])
        del self.buffer[: end + 4]
        with self.errors:
            return parse_response_head(raw)

    def close(self) -> None:
        """Closed at once, also in a cancelled scope: the peer sees its client leave."""
        self.stream.socket.close()


class BodyReader:
    """The body of one response, piece by piece as it arrives."""

    def __init__(self, conn: Connection, head: ResponseHead, *, no_body: bool = False) -> None:
        self._conn = conn
        self._decoder = ChunkedDecoder() if head.chunked and not no_body else None
        self._left = 0 if no_body else head.length  # None: until the close
        self.done = no_body or (self._decoder is None and self._left == 0)
        self.keep_alive = not head.close and (head.chunked or head.length is not None)

    async def next(self) -> bytes:
        """The next piece of the body (``b""`` is possible mid-body); check :attr:`done`
        after each.

        Raises:
            PeerConnectionError: the connection failed or closed before the body's end, or
                its chunk framing is broken.
        """
        conn = self._conn
        decoder = self._decoder
        if decoder is not None:  # the path of every streamed token: kept short
            with conn.errors:
                piece = decoder.take(conn.buffer) if conn.buffer else b""
                while not piece and not decoder.done:
                    data = await conn.receive()
                    if not data:
                        raise self._ended_early()
                    conn.buffer += data
                    piece = decoder.take(conn.buffer)
            self.done = decoder.done
            return piece
        if conn.buffer:
            data, conn.buffer = bytes(conn.buffer), bytearray()
        else:
            data = await conn.receive()
            if not data:
                if self._left is not None:
                    raise self._ended_early()
                self.done = True  # a body that ends with the connection
                return b""
        if self._left is None:
            return data
        piece, rest = data[: self._left], data[self._left :]
        conn.buffer += rest
        self._left -= len(piece)
        self.done = self._left == 0
        return piece

    def _ended_early(self) -> PeerConnectionError:
        return PeerConnectionError(f"{self._conn.peer} closed the connection mid-response")

    async def read_all(self) -> bytes:
        out = bytearray()
        while not self.done:
            out += await self.next()
        return bytes(out)


class Pool:
    """Connections to one peer, the idle ones kept for the next request.

    ``peer`` names it in errors ("the runner"); ``where`` says what could not be reached
    when a connection cannot be opened (its address; else ``peer``).  ``idle_limit``:
    seconds an idle connection is trusted, a little under the peer's keep-alive timeout.
    """

    def __init__(
        self, connect: Connect, *, peer: str, max_idle: int, idle_limit: float,
        where: str | None = None,
    ) -> None:  # fmt: skip
        self._connect = connect
        self.peer = peer
        self._where = where or peer
        self._max_idle = max_idle
        self._idle_limit = idle_limit
        self._idle: deque[Connection] = deque()
        self._closed = False
        self.connections_opened = 0  # for tests and benchmarks

    async def connect(self) -> Connection:
        """A new connection (not from the pool)."""
        try:
            stream = await self._connect()
        except OSError as exc:
            raise PeerConnectionError(f"cannot connect to {self._where}: {exc}") from exc
        self.connections_opened += 1
        return Connection(stream, self.peer)

    def _take_idle(self) -> Connection | None:
        now = trio.current_time()
        while self._idle:
            conn = self._idle.pop()  # the most recently used one
            if now - conn.idle_since < self._idle_limit and not conn.buffer:
                return conn
            conn.close()  # stale: the peer is about to drop it anyway
        return None

    def give_back(self, conn: Connection) -> None:
        """A connection whose response was read to its end, for the next request."""
        if self._closed or len(self._idle) >= self._max_idle or conn.buffer:
            conn.close()
            return
        conn.idle_since = trio.current_time()
        conn.received_any = False
        self._idle.append(conn)

    async def send(self, message: bytes) -> tuple[Connection, ResponseHead]:
        """Send a whole request and read its response head (once more on a fresh
        connection if a pooled one turns out to be closed).  The caller reads the body and
        gives the connection back, or closes it.

        Raises:
            PeerConnectionError: the peer cannot be reached or failed before answering.
        """
        conn = self._take_idle()
        reused = conn is not None
        if conn is None:
            conn = await self.connect()
        try:
            try:
                await conn.send_all(message)
                head = await conn.read_head()
            except PeerConnectionError:
                if not reused or conn.received_any:
                    raise
                conn.close()
                conn = await self.connect()
                await conn.send_all(message)
                head = await conn.read_head()
        except BaseException:
            conn.close()
            raise
        return conn, head

    async def request(self, message: bytes) -> tuple[ResponseHead, bytes]:
        """A plain request: its response head and whole body.  The connection goes back to
        the pool when the peer keeps it open."""
        conn, head = await self.send(message)
        body = BodyReader(conn, head, no_body=message.startswith(b"HEAD "))
        try:
            data = await body.read_all()
        except BaseException:
            conn.close()
            raise
        if body.keep_alive:
            self.give_back(conn)
        else:
            conn.close()
        return head, data

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()
