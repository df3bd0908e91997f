"""The front door's connection budget: how many client connections it holds at once.

Every client connection costs the server one file descriptor for as long as it is open, and
descriptors are finite (``RLIMIT_NOFILE``; a soft limit of 1,024 is a common default).  Left
alone, about a thousand idle clients would take every descriptor: new clients could not be
accepted and no runner could start (its pipes and sockets need descriptors too).  So:

- at start-up the server raises its soft limit to the hard one, as Go's runtime does for
  every Go program (:func:`raise_open_file_limit`);
- the front door holds at most ``cap`` client connections (:class:`ConnectionBudget`),
  by default the limit less a reserve for runners, the model store, logs and the requests'
  own files (:func:`default_cap`);
- a connection beyond the cap closes the oldest *idle* one (waiting for a request head,
  its first or its next) and is served in its place; when none is idle, it is answered a
  fast ``503`` with ``Retry-After`` and closed, without its request being read
  (:func:`refuse`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import trio

from ..runner.file_limit import remember_for_children
from .http1 import content_length, response_head

log = logging.getLogger(__name__)

# Descriptors kept out of the connection budget: a quarter of the limit, at least RESERVE_MIN.
RESERVE_MIN = 128
RESERVE_SHARE = 4
MIN_CAP = 16  # however low the limit, a few connections are served
# Where an unlimited hard limit leaves the soft one: Linux's fs.nr_open when it can be read,
# else this (macOS's OPEN_MAX, which Go's runtime uses there too).
FALLBACK_CEILING = 10240
RETRY_AFTER = 1  # seconds, in the 503 answer
REFUSAL_BODY = b'{"error":"server busy: too many open connections, try again shortly"}'
_REFUSAL_HEADERS = [
    (b"content-type", b"application/json; charset=utf-8"),
    (b"retry-after", b"%d" % RETRY_AFTER),
]
_DRAIN_READS = 4  # reads of what a refused client already sent (never waiting for more)


@dataclass(frozen=True)
class FileLimit:
    """The process's open file limit: the soft limit before and after start-up, the hard one
    (``resource.RLIM_INFINITY`` when unlimited)."""

    before: int
    soft: int
    hard: int


def _ceiling() -> int:
    """The highest soft limit this system allows when the hard one is unlimited."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, ValueError):
            with open("/proc/sys/fs/nr_open") as f:
                return int(f.read())
    return FALLBACK_CEILING


def raise_open_file_limit() -> FileLimit:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit, as Go's runtime does at start
    (an unlimited hard limit: to the system's ceiling).  Logged; a refusal keeps the soft
    limit as it was (and is logged as a warning)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling() if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft >= target:
        log.info("open file limit %d (hard limit %s)", soft, _text(hard))
        return FileLimit(soft, soft, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        log.warning(
            "open file limit %d: could not raise it to %d (hard limit %s): %s",
            soft, target, _text(hard), exc,
        )  # fmt: skip
        return FileLimit(soft, soft, hard)
    log.info("open file limit raised from %d to %d (hard limit %s)", soft, target, _text(hard))
    remember_for_children(soft)  # runners run under the limit the server started with
    return FileLimit(soft, target, hard)


def _text(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)


def soft_file_limit() -> int:
    """The soft open file limit now (an unlimited one as the system's ceiling)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _ceiling() if soft == resource.RLIM_INFINITY else soft


def default_cap(limit: int) -> int:
    """The connection cap for an open file limit: ``limit - max(128, limit // 4)``, at least
    16.  The reserve covers the server's own descriptors (listener, event loop, logs, the
    store), each runner's (pipes, its socket connections) and the requests' own (a
    generation's runner connection, an upload's blob file)."""
    return max(MIN_CAP, limit - max(RESERVE_MIN, limit // RESERVE_SHARE))


class ConnectionBudget:
    """The client connections the front door holds, at most ``cap``.

    A connection holds its place for as long as its handler runs (:meth:`place`), whoever
    serves it (the front door or hypercorn).  While waiting for a request head it is *idle*
    (:meth:`idle`) and may be closed to make room for a newer one, the oldest first."""

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"the connection cap must be at least 1, not {cap}")
        self.cap = cap
        self._held: set[object] = set()
        self._leaving: set[object] = set()  # held, closing without waiting on the client
        self.peak = 0  # the most held at once
        self.evicted = 0  # idle connections closed to make room
        self.refused = 0  # connections answered 503
        self._idle: dict[trio.CancelScope, None] = {}  # oldest first (insertion order)
        self._freed = trio.lowlevel.ParkingLot()
        self._changed = trio.lowlevel.ParkingLot()  # for wait_held()
        self._full = False  # since the last place given without closing or refusing one

    @property
    def held(self) -> int:
        return len(self._held)

    @contextlib.asynccontextmanager
    async def place(self, connection: object) -> AsyncIterator[bool]:
        """Hold a place for ``connection`` while the block runs; True when it got one
        (perhaps after closing the oldest idle connection), False when every place is taken
        by a busy connection (the caller refuses it)."""
        admitted = await self._admit()
        if admitted:
            self._held.add(connection)
            self.peak = max(self.peak, self.held)
            self._changed.unpark_all()
        try:
            yield admitted
        finally:
            if admitted:
                self._held.discard(connection)
                self._leaving.discard(connection)
                self._freed.unpark()
                self._changed.unpark_all()

    async def _admit(self) -> bool:
        while self.held >= self.cap:
            if self._idle:
                oldest = next(iter(self._idle))
                del self._idle[oldest]
                oldest.cancel()
                self.evicted += 1
                self._note_full("closing the oldest idle ones")
            elif not self._leaving:
                self.refused += 1
                self._note_full("answering new ones 503")
                return False
            # The closed one's handler leaves at its next checkpoint (closing is shielded
            # and does not wait on the client), as does one already leaving; whichever
            # leaves first frees a place.
            await self._freed.park()
        if self.held < self.cap - 1:
            self._full = False
        return True

    def leaving(self, connection: object) -> None:
        """``connection`` closes now, without waiting on its client: a newcomer at the cap
        waits for its place rather than being refused."""
        if connection in self._held:
            self._leaving.add(connection)

    async def wait_changed(self) -> None:
        """Until a connection takes or gives back a place (the accept loop's back-off ends
        when one closes: its descriptor is free again)."""
        await self._changed.park()

    async def wait_held(self, count: int) -> None:
        """Until exactly ``count`` places are held (tests, benchmarks)."""
        while self.held != count:
            await self._changed.park()
        await trio.lowlevel.checkpoint()

    def _note_full(self, what: str) -> None:
        if not self._full:
            self._full = True
            log.warning(
                "%d client connections open, the most allowed (OLLAMATRIO_MAX_CONNECTIONS): %s",
                self.cap, what,
            )  # fmt: skip

    @contextlib.contextmanager
    def idle(self, scope: trio.CancelScope) -> Iterator[None]:
        """While the block runs, the connection waits for a request head: ``scope`` may be
        cancelled to close it (its handler must then close it even if a head came in)."""
        self._idle[scope] = None
        try:
            yield
        finally:
            self._idle.pop(scope, None)

    def close_idle(self) -> None:
        """Cancel every idle connection's scope (shutdown)."""
        for scope in self._idle:
            scope.cancel()


async def refuse(stream: trio.SocketStream) -> None:
    """Answer a connection over the cap ``503`` and close it, at once: one non-blocking write
    (a fresh socket's buffer takes it), then what the client already sent is read without
    waiting for more, so that closing does not reset the connection over an unread request."""
    with trio.CancelScope(shield=True):
        sock = stream.socket
        with contextlib.suppress(OSError):
            fd = sock.fileno()
            framing = content_length(len(REFUSAL_BODY))
            os.write(fd, response_head(503, _REFUSAL_HEADERS, framing, close=True) + REFUSAL_BODY)
            sock.shutdown(socket.SHUT_WR)
            for _ in range(_DRAIN_READS):
                if not os.read(fd, 65536):
                    break
        await stream.aclose()
