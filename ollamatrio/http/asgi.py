"""One HTTP/1.1 request served by the front door (http/front.py): ASGI ``receive``/``send``
straight over the client connection.

The scope is the one hypercorn builds for HTTP/1.1 (``hypercorn/protocol/http_stream.py``):
percent-decoded ``path``, ``raw_path`` and ``query_string`` split at the first ``?``, the
lifespan ``state`` copied, no extensions.  ``receive`` hands the body over as it arrives (a
blob upload is never buffered whole here), then ``http.disconnect`` when the client leaves or
the response is complete.  ``send`` frames the response as h11 would: the app's
``Content-Length`` if it gave one, else ``Content-Length`` for a body sent in one message and
chunks for the rest; no body for ``HEAD``, 1xx, 204 and 304.  The head goes out with the
first body piece, and every piece costs one non-blocking ``write`` (``_Connection.write``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import unquote

import trio

from ..errors import RequestTooLargeError
from .http1 import CHUNKED, LAST_CHUNK, Head, chunk, content_length, response_head

log = logging.getLogger(__name__)

ASGIApp = Callable[..., Awaitable[None]]
_FRAMING = (b"content-length", b"transfer-encoding", b"connection")


class Connection(Protocol):
    """What an exchange needs of the client connection it runs on (``front._Connection``)."""

    client: tuple[str, int]
    server: tuple[str, int]
    buffer: bytearray  # bytes read past the head, not yet consumed
    eof: bool  # the client closed its side
    linger: bool  # closing must read on first: the request was not read to its end

    @property
    def root_path(self) -> str: ...

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
        self.body_left = head.content_length
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
        self._headers: list[tuple[bytes, bytes]] = []
        self._length: int | None = None  # the app's Content-Length: what is left of it
        self._chunked = False
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
            "http_version": "1.1",
            "method": self.head.method,
            "scheme": "http",
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
        if self._body_read:  # past the body: until the client leaves or the answer is out
            if self.finished:
                await trio.lowlevel.checkpoint()
            else:
                with trio.CancelScope() as self._waiting:
                    await connection.wait_for_eof()
                self._waiting = None
            return {"type": "http.disconnect"}
        if self.limit is not None and self.body_left > self.limit:  # answered 413 unread
            raise RequestTooLargeError(f"request body exceeds {self.limit} bytes")
        if self.body_left and not connection.buffer:
            if self.head.expect_continue and not self.started:
                self.head.expect_continue = False  # once
                await connection.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await connection.receive()
            if connection.eof:
                return {"type": "http.disconnect"}
        piece = bytes(connection.buffer[: self.body_left])
        del connection.buffer[: len(piece)]
        self.body_left -= len(piece)
        self._body_read = self.body_left == 0
        return {"type": "http.request", "body": piece, "more_body": not self._body_read}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self._start(message)
            if not self.defer_head and self._length is None and not self._empty():
                # A body of unknown length may be long in coming (a stream of events):
                # the client gets the head now, as hypercorn sends it.
                await self.connection.write(self._head(b"", True))
            return
        if self.finished:
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
