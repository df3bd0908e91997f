"""HTTP/1.1 from the gateway to one host, on raw Trio TCP streams with a keep-alive pool.

The hosts are ollamatrio servers (their front door keeps a connection alive for 30 s between
requests, ``serve.hypercorn_config``), so a request takes an idle pooled connection when one
is fresh enough, else a new one; after a complete response the connection goes back to the
pool.  A response that is abandoned half-way (the client left) closes its connection: that
is how the host learns that its client went away and frees the generation's slot.

A pooled connection the host closed while idle fails before any response byte arrives; such
a request is sent once more on a fresh connection (the host processed nothing).

Bodies are read as they arrive, one read per wake-up, and handed on without being parsed:
:class:`BodyReader` only tracks where the body ends (``Content-Length``, chunked framing
decoded by the runner client's :class:`~ollamatrio.engines.runner_http.ChunkedDecoder`, or
the close).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

import trio

from ..engines.runner_http import RECEIVE_SIZE, ChunkedDecoder, RunnerConnectionError, receive_some

MAX_HEAD: Final = 64 * 1024
MAX_IDLE: Final = 32  # pooled connections per host
IDLE_LIMIT: Final = 25.0  # seconds: a little under the host's keep-alive timeout (30 s)


class HostConnectionError(Exception):
    """The host could not be reached, or its connection failed or closed mid-response."""


@dataclass(frozen=True)
class ResponseHead:
    status: int
    headers: list[tuple[bytes, bytes]]  # names lower-cased, in order
    length: int | None  # Content-Length, if given
    chunked: bool
    close: bool  # the host closes the connection after this response

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


class Upstream:
    """One connection to a host."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()  # received, not yet consumed
        self.idle_since = 0.0
        self.received_any = False
        self._drained = False  # the last read did not fill the buffer: wait before reading

    async def receive(self) -> bytes:
        """The next bytes from the host (``b""`` at the connection's end)."""
        try:
            data = await receive_some(self.stream, drained=self._drained)
        except (trio.ClosedResourceError, OSError) as exc:
            raise HostConnectionError(f"connection to the host failed: {exc}") from exc
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
                raise HostConnectionError("the host sent an oversized response head")
            data = await self.receive()
            if not data:
                raise HostConnectionError("the host closed the connection")
            self.buffer += data
        raw = bytes(self.buffer[:end])
        del self.buffer[: end + 4]
        status_line, *lines = raw.split(b"\r\n")
        try:
            status = int(status_line.split(b" ", 2)[1])
        except (IndexError, ValueError):
            raise HostConnectionError(f"bad status line from the host: {status_line!r}") from None
        headers = []
        for line in lines:
            name, _, value = line.partition(b":")
            headers.append((name.strip().lower(), value.strip()))
        fields = dict(headers)
        length = fields.get(b"content-length")
        return ResponseHead(
            status,
            headers,
            int(length) if length is not None and length.isdigit() else None,
            fields.get(b"transfer-encoding", b"").lower() == b"chunked",
            b"close" in fields.get(b"connection", b"").lower(),
        )

    def close(self) -> None:
        self.stream.socket.close()


class BodyReader:
    """The body of one response, piece by piece as it arrives."""

    def __init__(self, upstream: Upstream, head: ResponseHead, *, no_body: bool) -> None:
        self._up = upstream
        self._decoder = ChunkedDecoder() if head.chunked and not no_body else None
        self._left = 0 if no_body else head.length  # None: until the close
        self.done = no_body or (self._decoder is None and self._left == 0)
        self.keep_alive = not head.close and (head.chunked or head.length is not None)

    async def next(self) -> bytes:
        """The next piece of the body (``b""`` is possible mid-body: framing only); check
        :attr:`done` after each.

        Raises:
            HostConnectionError: the connection failed or closed before the body's end.
        """
        up = self._up
        if up.buffer:
            data, up.buffer = bytes(up.buffer), bytearray()
        else:
            data = await up.receive()
            if not data:
                if self._decoder is None and self._left is None:
                    self.done = True  # a body that ends with the connection
                    return b""
                raise HostConnectionError("the host closed the connection mid-response")
        if self._decoder is not None:
            try:
                piece = self._decoder.feed(data)
            except RunnerConnectionError as exc:
                raise HostConnectionError(str(exc)) from None
            if self._decoder.finished:
                self.done = True
                up.buffer = self._decoder.leftover()
            return piece
        if self._left is None:
            return data
        piece, rest = data[: self._left], data[self._left :]
        up.buffer += rest
        self._left -= len(piece)
        self.done = self._left == 0
        return piece

    async def read_all(self) -> bytes:
        out = bytearray()
        while not self.done:
            out += await self.next()
        return bytes(out)


class HostPool:
    """Connections to one host (``address``: host and port), the idle ones kept."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.authority = f"{address[0]}:{address[1]}".encode()
        self._idle: deque[Upstream] = deque()
        self._closed = False
        self.connections_opened = 0  # for tests and benchmarks

    async def connect(self) -> Upstream:
        try:
            stream = await trio.open_tcp_stream(*self.address)
        except OSError as exc:
            raise HostConnectionError(
                f"cannot connect to {self.authority.decode()}: {exc}"
            ) from exc
        self.connections_opened += 1
        return Upstream(stream)

    def _take_idle(self) -> Upstream | None:
        now = trio.current_time()
        while self._idle:
            conn = self._idle.pop()  # the most recently used one
            if now - conn.idle_since < IDLE_LIMIT and not conn.buffer:
                return conn
            conn.close()
        return None

    def give_back(self, conn: Upstream) -> None:
        """A connection whose response was read to its end, for the next request."""
        if self._closed or len(self._idle) >= MAX_IDLE or conn.buffer:
            conn.close()
            return
        conn.idle_since = trio.current_time()
        conn.received_any = False
        self._idle.append(conn)

    async def send(self, message: bytes) -> tuple[Upstream, ResponseHead]:
        """Send a whole request and read its response head (once more on a fresh
        connection if a pooled one turns out to be closed).  The caller reads the body and
        gives the connection back, or closes it.

        Raises:
            HostConnectionError: the host cannot be reached or failed before answering.
        """
        conn = self._take_idle()
        reused = conn is not None
        if conn is None:
            conn = await self.connect()
        try:
            try:
                await conn.stream.send_all(message)
                head = await conn.read_head()
            except (trio.BrokenResourceError, HostConnectionError, OSError):
                if not reused or conn.received_any:
                    raise
                conn.close()
                conn = await self.connect()
                await conn.stream.send_all(message)
                head = await conn.read_head()
        except (trio.BrokenResourceError, OSError) as exc:
            conn.close()
            raise HostConnectionError(f"connection to the host failed: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return conn, head

    async def get(self, path: str) -> tuple[int, bytes]:
        """A plain ``GET``: (status, body)."""
        message = b"GET %b HTTP/1.1\r\nhost: %b\r\n\r\n" % (path.encode(), self.authority)
        conn, head = await self.send(message)
        body = BodyReader(conn, head, no_body=False)
        try:
            data = await body.read_all()
        except BaseException:
            conn.close()
            raise
        if body.keep_alive:
            self.give_back(conn)
        else:
            conn.close()
        return head.status, data

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()
