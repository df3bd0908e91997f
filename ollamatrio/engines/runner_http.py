"""HTTP/1.1 to one runner's llama.cpp server over its Unix socket: the project's client
(``http1/client.py``) with the runner's API key, and llama.cpp's server-sent events.

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
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Final, Protocol

import orjson
import trio

from ..errors import PeerConnectionError, PeerStatusError
from ..http1.client import BodyReader, Pool
from ..http1.framing import ResponseHead

MAX_IDLE: Final = 8  # pooled connections per runner
#: llama.cpp closes idle connections after 5 s; give them up a little earlier.
IDLE_LIMIT: Final = 4.0

#: The client's connection errors, as the engine names them.
RunnerConnectionError = PeerConnectionError


class RunnerStatusError(PeerStatusError):
    """The runner answered a stream request with an HTTP error (``body`` is its JSON)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"runner answered HTTP {status}", status, body)


class EventSource(Protocol):
    async def next_batch(self) -> list[dict[str, Any]]: ...


class EventStream:
    """The SSE events of one streamed response, a batch per wake-up.

    :meth:`next_batch` waits for data, then returns the JSON payloads of every complete
    event received so far (``[]`` once the response has ended).  ``error:`` events come back
    as ``{"error": ...}`` objects, as llama.cpp means them.
    """

    def __init__(self, body: BodyReader) -> None:
        self._body = body
        self._events = bytearray()

    @property
    def ended(self) -> bool:
        return self._body.done

    def _decode(self, body: bytes) -> list[dict[str, Any]]:
        """The events that ``body`` (the next piece of the response body) completes."""
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
        body = self._body
        while not body.done:
            batch = self._decode(await body.next())
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
        self._auth = f"Authorization: Bearer {api_key}\r\n".encode()
        self._pool = Pool(
            partial(trio.open_unix_socket, socket_path),
            peer="the runner", max_idle=MAX_IDLE, idle_limit=IDLE_LIMIT,
        )  # fmt: skip

    @property
    def connections_opened(self) -> int:  # for tests and benchmarks
        return self._pool.connections_opened

    def _head(self, method: str, path: str, body: bytes | None) -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nHost: runner\r\n".encode() + self._auth
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        return head + b"\r\n" + (body or b"")

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """A plain request: (status, body).  The connection goes back to the pool."""
        head, data = await self._pool.request(self._head(method, path, body))
        return head.status, data

    @asynccontextmanager
    async def stream(
        self, path: str, body: bytes
    ) -> AsyncIterator[tuple[ResponseHead, EventStream]]:
        """POST ``body`` and stream the SSE answer (:class:`RunnerStatusError` for a status
        other than 200).  Leaving the block closes the connection, which stops a generation
        that is still running."""
        conn, head = await self._pool.send(self._head("POST", path, body))
        try:
            reader = BodyReader(conn, head)
            if head.status != 200:
                raise RunnerStatusError(head.status, await reader.read_all())
            yield head, EventStream(reader)
        finally:
            conn.close()  # llama.cpp would close it after a stream anyway

    def close(self) -> None:
        self._pool.close()
