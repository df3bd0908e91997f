"""One HTTP/1.1 (or HTTP/1.0) request served by the front door (http/front.py): ASGI
``receive``/``send`` straight over the client connection.

The scope is the one hypercorn builds for HTTP/1.1 (``hypercorn/protocol/http_stream.py``):
percent-decoded ``path``, ``raw_path`` and ``query_string`` split at the first ``?``, the
lifespan ``state`` copied, no extensions.  ``receive`` hands the body over as it arrives
(``Content-Length`` or chunked; a blob upload is never buffered whole here), then
``http.disconnect`` when the client leaves or the response is complete.  A body that stalls
(no byte for the connection's ``body_timeout``) is answered ``408`` here, a malformed chunked
one ``400``, and the app is told that the client left.  ``send`` frames the response as h11
would: the app's ``Content-Length`` if it gave one, else ``Content-Length`` for a body sent in
one message and chunks for the rest (for an HTTP/1.0 client, which cannot read chunks: the
body as it is, ended by closing the connection); no body for ``HEAD``, 1xx, 204 and 304.  The
head goes out with the first body piece, and every piece costs one non-blocking ``write``
(``_Connection.write``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import unquote

import trio

from ..errors import RequestTooLargeError
from ..http1.framing import ChunkedDecoder, FramingError
from .http1 import (
    CHUNKED,
    LAST_CHUNK,
    Head,
    chunk,
    content_length,
    response_head,
)

log = logging.getLogger(__name__)

ASGIApp = Callable[..., Awaitable[None]]
# Set on the ``http.disconnect`` an app receives after the exchange answered the request
# itself (408 for a stalled body, 400 for malformed chunks): the status it answered, so the
# app logs no access line of its own (the exchange logged that answer).
ANSWERED = "ollamatrio.answered"
_FRAMING = (b"content-length", b"transfer-encoding", b"connection")


class Connection(Protocol):
    """What an exchange needs of the client connection it runs on (``front._Connection``)."""

    client: tuple[str, int]
    server: tuple[str, int]
    buffer: bytearray  # bytes read past the head, not yet consumed
    eof: bool  # the client closed its side
    broken: bool  # a write failed or timed out: the client cannot be answered any more
    linger: bool  # closing must read on first: the request was not read to its end

    @property
    def body_timeout(self) -> float: ...  # seconds a request body may go without a byte

    @property
    def root_path(self) -> str: ...

    @property
    def scheme(self) -> str: ...  # "http", or "https" over TLS

    @property
    def state(self) -> dict[str, Any]: ...  # the lifespan state, copied into each scope

    @property
    def stopping(self) -> bool: ...  # shutdown has begun

    async def write(self, data: bytes) -> None: ...

    async def receive(self) -> None: ...

    async def wait_for_eof(self) -> None: ...


class Exchange:
    """One request served by the front door: ASGI ``receive``/``send`` over the connection."""

    def __init__(
        self, connection: Connection, head: Head, *, limit: int | None = None,
        defer_head: bool = False,
    ) -> None:  # fmt: skip
        self.connection = connection
        self.head = head
        # Body bytes still to read (a chunked body: 1 until it ends, its length is unknown).
        self.body_left = 1 if head.chunked else head.content_length
        self._chunks = ChunkedDecoder() if head.chunked else None
        self.limit = limit  # a declared body over this is refused unread (413)
        # Hold the head back until the first body piece (one write for both), also for a
        # body of unknown length: only for apps whose first piece follows at once.
        self.defer_head = defer_head
        self._body_read = False
        self._waiting: trio.CancelScope | None = None  # a receive() waiting past the body
        self.started = False  # the head is written
        self.finished = False  # the last body piece is written
        self.close = False
        self._status = 0
        self.refused = 0  # the status the exchange answered itself (see _refuse), if any
        self._headers: list[tuple[bytes, bytes]] = []
        self._length: int | None = None  # the app's Content-Length: what is left of it
        self._chunked = False
        self._until_close = False  # an HTTP/1.0 answer of unknown length: ended by closing
        self._no_body = False  # HEAD, 1xx, 204, 304

    def keep_alive(self) -> bool:
        """Whether the connection can carry the next request."""
        return self.finished and not self.close

    def scope(self) -> dict[str, Any]:
        connection = self.connection
        path, _, query = self.head.target.partition(b"?")
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": self.head.version,
            "method": self.head.method,
            "scheme": connection.scheme,
            "path": unquote(path.decode("ascii")),
            "raw_path": path,
            "query_string": query,
            "root_path": connection.root_path,
            "headers": self.head.headers,
            "client": connection.client,
            "server": connection.server,
            "state": connection.state.copy(),
            "extensions": {},
        }

    async def run(self, app: ASGIApp) -> None:
        """Run ``app`` on this request; an error before the response started is a 500 (as
        hypercorn answers it), after it the connection closes mid-body.  An app that returns
        without answering because the client closed its side (``http.disconnect``: it left,
        or half-closed after its request, which Go's server also takes for a disconnect) is
        no error: the connection closes with nothing written."""
        failed = False
        try:
            await app(self.scope(), self.receive, self.send)
        except Exception:
            log.exception("error in the ASGI app")
            failed = True
        if not self.started:  # it raised, or returned without answering
            self.close = True
            if failed or not self.connection.eof:
                await self.connection.write(response_head(500, [], content_length(0), close=True))
        elif not self.finished or failed:
            self.close = True

    async def receive(self) -> dict[str, Any]:
        connection = self.connection
        if self._body_read or connection.broken:
            # Past the body: until the client leaves or the answer is out.
            if self.finished or connection.broken:
                await trio.lowlevel.checkpoint()
            else:
                with trio.CancelScope() as self._waiting:
                    await connection.wait_for_eof()
                self._waiting = None
            return self._disconnect()
        if self._chunks is not None:
            return await self._receive_chunks()
        if self.limit is not None and self.body_left > self.limit:  # answered 413 unread
            raise RequestTooLargeError(f"request body exceeds {self.limit} bytes")
        if self.body_left and not connection.buffer and not await self._read_more():
            return self._disconnect()
        piece = bytes(connection.buffer[: self.body_left])
        del connection.buffer[: len(piece)]
        self.body_left -= len(piece)
        self._body_read = self.body_left == 0
        return {"type": "http.request", "body": piece, "more_body": not self._body_read}

    async def _receive_chunks(self) -> dict[str, Any]:
        """The next piece of a chunked body (a chunked body's length is not known before it
        ends: the app limits what it reads, as the stream routes do)."""
        chunks = self._chunks
        assert chunks is not None
        connection = self.connection
        while True:
            try:
                piece = chunks.take(connection.buffer)
            except FramingError as exc:
                await self._refuse(400, str(exc).encode())
                return self._disconnect()
            if piece or chunks.done:
                break
            if not await self._read_more():
                return self._disconnect()
        self._body_read = chunks.done
        self.body_left = 0 if chunks.done else 1  # some of the body is still to come
        return {"type": "http.request", "body": piece, "more_body": not chunks.done}

    async def _read_more(self) -> bool:
        """Read the next bytes of the body into the buffer (after a ``100 Continue`` if the
        client waits for one); False if the client left, or sent nothing for the body
        timeout (answered ``408`` here: the app is then told that the client left)."""
        connection = self.connection
        if self.head.expect_continue and not self.started:
            self.head.expect_continue = False  # once
            await connection.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        with trio.move_on_after(connection.body_timeout) as deadline:
            await connection.receive()
        if deadline.cancelled_caught:
            await self._refuse(408, b"request body timed out: no byte for %gs"
                               % connection.body_timeout)  # fmt: skip
            return False
        return not connection.eof

    def _disconnect(self) -> dict[str, Any]:
        if self.refused:
            return {"type": "http.disconnect", ANSWERED: self.refused}
        return {"type": "http.disconnect"}

    async def _refuse(self, status: int, text: bytes) -> None:
        """Answer ``status`` with ``text`` and close, for a body the connection cannot go on
        reading, unless a response has started (then only the close is left)."""
        self.close = True
        self.refused = status
        log.info("%s %s: %d %s", self.head.method, self.head.target.decode("ascii"), status,
                 text.decode("ascii", "replace"))  # fmt: skip
        if not self.started:
            self.started = True
            self.connection.linger = True  # the rest of the body is not read
            head = response_head(status, [], content_length(len(text)), close=True)
            await self.connection.write(head + text)
        self.finished = True  # whatever the app sends now goes nowhere

    async def send(self, message: dict[str, Any]) -> None:
        if self.finished:
            return
        if message["type"] == "http.response.start":
            self._start(message)
            if not self.defer_head and self._length is None and not self._empty():
                # A body of unknown length may be long in coming (a stream of events):
                # the client gets the head now, as hypercorn sends it.
                await self.connection.write(self._head(b"", True))
            return
        body: bytes = message.get("body", b"")
        more: bool = message.get("more_body", False)
        if not self.started:
            data = self._head(body, more)
        elif self._chunked:  # the streams: one chunk per piece
            if body:
                data = chunk(body) if more else chunk(body) + LAST_CHUNK
            else:
                data = b"" if more else LAST_CHUNK
        elif self._no_body:
            data = b""
        elif self._until_close:
            data = body
        else:
            data = self._counted(body)
        if not more:
            self.finished = True
            if self._length:  # shorter than announced: only a close can tell the client
                self.close = True
            if self._waiting is not None:
                self._waiting.cancel()
        if data:
            await self.connection.write(data)
            if self.connection.broken and self._waiting is not None:
                # The client stopped reading (or left): the app learns it as a disconnect.
                self._waiting.cancel()

    def _start(self, message: dict[str, Any]) -> None:
        self._status = int(message["status"])
        headers = self._headers = []
        for name, value in message.get("headers", ()):
            name = bytes(name).lower()
            if name not in _FRAMING:
                headers.append((name, value))
            elif name == b"content-length":
                self._length = int(value)
            elif name == b"connection" and b"close" in bytes(value).lower():
                self.close = True

    def _empty(self) -> bool:
        """Whether the status has no body (and no framing headers)."""
        return self._status in (204, 304) or self._status < 200

    def _head(self, body: bytes, more: bool) -> bytes:
        """The response head, with the first body piece."""
        if not self._status:
            raise RuntimeError("a response body before http.response.start")
        self.started = True
        connection = self.connection
        # A body not read to its end leaves the connection unusable for the next request.
        connection.linger = self.body_left > 0
        self.close = (
            self.close or self.head.close or connection.linger or connection.eof
            or connection.stopping
        )  # fmt: skip
        status = self._status
        self._no_body = self.head.method == "HEAD" or self._empty()
        if self._length is not None:
            framing = content_length(self._length)
        elif self._empty():
            framing = b""
        elif more and self.head.version == "1.0":  # no chunks: the close ends the body
            framing = b""
            self._until_close = not self._no_body
            self.close = True
        elif more:
            framing = CHUNKED
            self._chunked = not self._no_body
        else:
            framing = content_length(len(body))
        data = response_head(status, self._headers, framing, close=self.close)
        if self._no_body:
            self._length = None  # announced, never sent
            return data
        if self._chunked:
            return data + chunk(body) if body else data
        if self._until_close:
            return data + body
        if self._length is not None:
            return data + self._counted(body)
        return data + body

    def _counted(self, body: bytes) -> bytes:
        """A piece of a body the app announced the length of (more is cut, and closes)."""
        assert self._length is not None
        if len(body) > self._length:
            body = body[: self._length]
            self.close = True
        self._length -= len(body)
        return body
