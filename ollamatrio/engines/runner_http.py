"""HTTP/1.1 to one runner's llama.cpp server over its Unix socket, on raw Trio streams.

This is the path every generated token takes, so it does only what llama.cpp's server needs:
one ``send_all`` per request, a status line and headers parsed once, and a streamed body
decoded from chunked framing straight into SSE events, all events that arrived together
handed over as one batch (one wake-up, one batch).

Connections: llama.cpp keeps a connection open after a plain response (``Keep-Alive:
timeout=5, max=100``) but closes it after every streamed one.  So plain requests (tokenize,
health, slots, metrics, embeddings) reuse idle connections from a small pool, and a stream
takes a pooled connection if one is idle (else a fresh one: about 50 µs on a Unix socket)
which is closed when the stream ends.  Closing the connection of a running stream is how
llama.cpp learns that the client went away: it stops generating and frees the slot.

A pooled connection the server closed while idle fails before any response byte arrives;
such a request is sent once more on a fresh connection (nothing was processed).
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final, Protocol

import orjson
import trio

MAX_HEAD: Final = 64 * 1024  # status line and headers
MAX_IDLE: Final = 8  # pooled connections per runner
#: llama.cpp closes idle connections after 5 s; give them up a little earlier.
IDLE_LIMIT: Final = 4.0
RECEIVE_SIZE: Final = 65536
_HEX_DIGITS: Final = b"0123456789abcdefABCDEF"


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


class RunnerConnectionError(Exception):
    """The runner's socket failed or closed mid-response (it may have died)."""


class RunnerStatusError(Exception):
    """The runner answered a stream request with an HTTP error (``body`` is its JSON)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"runner answered HTTP {status}")
        self.status = status
        self.body = body


class Response:
    """A response whose head has been read; the body is read by :meth:`read` or streamed
    by :class:`EventStream`."""

    def __init__(self, conn: _Connection, status: int, headers: dict[bytes, bytes]) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers
        self.chunked = headers.get(b"transfer-encoding", b"").lower() == b"chunked"
        self.keep_alive = headers.get(b"connection", b"").lower() != b"close"

    async def read(self) -> bytes:
        """The whole body."""
        conn = self._conn
        if self.chunked:
            decoder = ChunkedDecoder()
            out = bytearray()
            while not decoder.finished:
                out += decoder.feed(await conn.receive())
            conn.buffer = decoder.leftover()
            return bytes(out)
        length = int(self.headers.get(b"content-length", b"0"))
        while len(conn.buffer) < length:
            conn.buffer += await conn.receive()
        body = bytes(conn.buffer[:length])
        del conn.buffer[:length]
        return body

    def json(self, body: bytes) -> Any:
        return json.loads(body)


class _Connection:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()  # received, not yet consumed
        self.idle_since = 0.0
        self.received_any = False
        # The last read did not fill the buffer, so the socket is most likely empty: the
        # next one waits for data first instead of trying (and failing) a read.
        self._drained = False

    async def receive(self) -> bytes:
        """The next bytes from the runner (:func:`receive_some`)."""
        try:
            data = await receive_some(self.stream, drained=self._drained)
        except (trio.ClosedResourceError, OSError) as exc:
            raise RunnerConnectionError(f"connection to the runner failed: {exc}") from exc
        if not data:
            raise RunnerConnectionError("the runner closed the connection")
        self._drained = len(data) < RECEIVE_SIZE
        self.received_any = True
        return data

    async def read_head(self) -> tuple[int, dict[bytes, bytes]]:
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(self.buffer) > MAX_HEAD:
                raise RunnerConnectionError("the runner sent an oversized response head")
            self.buffer += await self.receive()
        head = bytes(self.buffer[:end])
        del self.buffer[: end + 4]
        status_line, *lines = head.split(b"\r\n")
        try:
            status = int(status_line.split(b" ", 2)[1])
        except (IndexError, ValueError):
            raise RunnerConnectionError(
                f"bad status line from the runner: {status_line!r}"
            ) from None
        headers = {}
        for line in lines:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def aclose(self) -> None:
        await self.stream.aclose()


class ChunkedDecoder:
    """Incremental decoder of ``Transfer-Encoding: chunked`` bodies."""

    _SIZE, _DATA, _DATA_END, _TRAILER = range(4)

    def __init__(self) -> None:
        self._raw = bytearray()
        self._state = self._SIZE
        self._need = 0  # chunk data bytes still expected
        self.finished = False

    def feed(self, data: bytes | bytearray) -> bytes:
        """Body bytes decoded from ``data`` (and whatever was left over before)."""
        if not self._raw and self._state == self._SIZE:
            # The common case while streaming: ``data`` is exactly one whole chunk (llama.cpp
            # writes an event a chunk, and a read takes what one write sent).
            eol = data.find(b"\r\n")
            if 0 < eol <= 8 and not data[:eol].strip(_HEX_DIGITS):
                end = eol + 2 + int(data[:eol], 16)
                if end > eol + 2 and len(data) == end + 2 and data.endswith(b"\r\n"):
                    return bytes(data[eol + 2 : end])
        raw = self._raw
        raw += data
        out = bytearray()
        pos = 0
        while not self.finished:
            state = self._state
            if state == self._DATA:
                take = min(self._need, len(raw) - pos)
                if take <= 0:
                    break
                out += raw[pos : pos + take]
                pos += take
                self._need -= take
                if self._need == 0:
                    self._state = self._DATA_END
            elif state == self._DATA_END:
                if len(raw) - pos < 2:
                    break
                pos += 2
                self._state = self._SIZE
            else:
                eol = raw.find(b"\r\n", pos)
                if eol < 0:
                    break
                line = bytes(raw[pos:eol])
                pos = eol + 2
                if state == self._TRAILER:
                    self.finished = not line  # trailer fields end with an empty line
                    continue
                size_text = line.split(b";", 1)[0].strip()
                try:
                    self._need = int(size_text, 16)
                except ValueError:
                    raise RunnerConnectionError(
                        f"bad chunk size from the runner: {size_text!r}"
                    ) from None
                self._state = self._DATA if self._need else self._TRAILER
        del raw[:pos]
        return bytes(out)

    def leftover(self) -> bytearray:
        return self._raw


class EventSource(Protocol):
    async def next_batch(self) -> list[dict[str, Any]]: ...


class EventStream:
    """The SSE events of one streamed response, a batch per wake-up.

    :meth:`next_batch` waits for data, then returns the JSON payloads of every complete
    event received so far (``[]`` once the response has ended).  ``error:`` events come back
    as ``{"error": ...}`` objects, as llama.cpp means them.
    """

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._decoder = ChunkedDecoder()
        self._events = bytearray()
        self.ended = False
        first = conn.buffer
        conn.buffer = bytearray()
        self._pending = self._decode(first) if first else []

    def _decode(self, data: bytes | bytearray) -> list[dict[str, Any]]:
        body = self._decoder.feed(data)
        if self._decoder.finished:
            self.ended = True
        if (
            not self._events and body.startswith(b"data: ") and body.endswith(b"\n\n")
            and body.find(b"\n") == len(body) - 2
        ):  # fmt: skip
            # The common case: one whole ``data:`` event, the JSON on its one line.
            event = parse_data(body[6:-2])
            return [] if event is None else [event]
        events = self._events
        events += body
        out: list[dict[str, Any]] = []
        start = 0
        while True:
            end = events.find(b"\n\n", start)
            if end < 0:
                break
            event = parse_event(events[start:end])
            if event is not None:
                out.append(event)
            start = end + 2
        del events[:start]
        return out

    async def next_batch(self) -> list[dict[str, Any]]:
        if self._pending:
            batch, self._pending = self._pending, []
            return batch
        while not self.ended:
            batch = self._decode(await self._conn.receive())
            if batch:
                return batch
        return []


def parse_data(payload: bytes) -> dict[str, Any] | None:
    """A ``data:`` line's payload; None for ``[DONE]``."""
    payload = payload.strip()
    if payload == b"[DONE]":
        return None
    event = orjson.loads(payload)  # once per token: five times faster than json's
    return event if isinstance(event, dict) else {"data": event}


def parse_event(raw: bytes | bytearray) -> dict[str, Any] | None:
    """One SSE event's payload: ``data: {...}`` or ``error: {...}``; None for comments,
    empty events and ``[DONE]``."""
    for line in bytes(raw).split(b"\n"):
        if line.startswith(b"data:"):
            return parse_data(line[5:])
        if line.startswith(b"error:"):
            event = json.loads(line[6:].strip())
            if not isinstance(event, dict) or "error" not in event:
                event = {"error": event}
            return event
    return None


class RunnerHttp:
    """A client for one runner's socket, with a small pool of keep-alive connections."""

    def __init__(self, socket_path: str, api_key: str) -> None:
        self._path = socket_path
        self._auth = f"Authorization: Bearer {api_key}\r\n".encode()
        self._idle: deque[_Connection] = deque()
        self._closed = False
        self.connections_opened = 0  # for tests and benchmarks

    async def _connect(self) -> _Connection:
        try:
            stream = await trio.open_unix_socket(self._path)
        except OSError as exc:
            raise RunnerConnectionError(f"cannot connect to the runner: {exc}") from exc
        self.connections_opened += 1
        return _Connection(stream)

    def _take_idle(self) -> _Connection | None:
        now = trio.current_time()
        while self._idle:
            conn = self._idle.pop()  # the most recently used one
            if now - conn.idle_since < IDLE_LIMIT and not conn.buffer:
                return conn
            conn.stream.socket.close()  # stale: the server is about to drop it anyway
        return None

    def _give_back(self, conn: _Connection) -> None:
        if self._closed or len(self._idle) >= MAX_IDLE:
            conn.stream.socket.close()
            return
        conn.idle_since = trio.current_time()
        conn.received_any = False
        self._idle.append(conn)

    def _head(self, method: str, path: str, body: bytes | None) -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nHost: runner\r\n".encode() + self._auth
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        return head + b"\r\n" + (body or b"")

    async def _send(self, message: bytes) -> tuple[_Connection, int, dict[bytes, bytes]]:
        """Send on a pooled connection (once more on a fresh one if the pooled one turns
        out to be closed), and read the response head."""
        conn = self._take_idle()
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        try:
            try:
                await conn.stream.send_all(message)
                status, headers = await conn.read_head()
            except (trio.BrokenResourceError, RunnerConnectionError, OSError):
                if not reused or conn.received_any:
                    raise
                conn.stream.socket.close()
                conn = await self._connect()
                await conn.stream.send_all(message)
                status, headers = await conn.read_head()
        except (trio.BrokenResourceError, OSError) as exc:
            conn.stream.socket.close()
            raise RunnerConnectionError(f"connection to the runner failed: {exc}") from exc
        except BaseException:
            conn.stream.socket.close()
            raise
        return conn, status, headers

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """A plain request: (status, body).  The connection goes back to the pool."""
        conn, status, headers = await self._send(self._head(method, path, body))
        response = Response(conn, status, headers)
        try:
            data = await response.read()
        except BaseException:
            conn.stream.socket.close()
            raise
        if response.keep_alive:
            self._give_back(conn)
        else:
            conn.stream.socket.close()
        return status, data

    @asynccontextmanager
    async def stream(self, path: str, body: bytes) -> AsyncIterator[tuple[Response, EventStream]]:
        """POST ``body`` and stream the SSE answer (:class:`RunnerStatusError` for a status
        other than 200).  Leaving the block closes the connection, which stops a generation
        that is still running."""
        conn, status, headers = await self._send(self._head("POST", path, body))
        response = Response(conn, status, headers)
        if status != 200:
            try:
                error_body = await response.read()
            finally:
                conn.stream.socket.close()
            raise RunnerStatusError(status, error_body)
        events = EventStream(conn)
        try:
            yield response, events
        finally:
            conn.stream.socket.close()  # llama.cpp would close it after a stream anyway

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().stream.socket.close()
