"""Accepting client connections when descriptors run out, quietly.

``trio.serve_listeners`` answers an accept that fails for lack of resources (``EMFILE``,
``ENFILE``, ``ENOMEM``, ``ENOBUFS``) by logging the whole traceback and trying again 0.1 s
later: with every descriptor held by clients that do not go away, that is ten tracebacks a
second for as long as they stay (2 MB of log in 75 s, measured).  :func:`serve_listeners`
here does the same job with one warning line a second at most, carrying the count of
failures since the last line, and backs off (0.1 s doubling to 1 s) between tries; a
connection closing ends the wait at once, since its descriptor is what the next accept needs.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

log = logging.getLogger(__name__)

# The accept errors that say "not now" (as trio's serve_listeners has them): anything else
# is a broken listener, raised.
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
LOG_INTERVAL = 1.0  # seconds: at most one line this often
FIRST_BACKOFF = 0.1  # seconds before the first retry (as trio's)
MAX_BACKOFF = 1.0

Handler = Callable[[trio.SocketStream], Awaitable[Any]]


class AcceptErrors:
    """The resource errors of accepting, logged one line a second at most (with the count
    since the last line), and the back-off before the next try."""

    def __init__(self) -> None:
        self.failures = 0  # in all (tests look)
        self._unlogged = 0
        self._next_line = -float("inf")  # trio time of the next line allowed
        self.backoff = 0.0  # seconds to wait before the next try; 0 while accepting works

    def failed(self, error: OSError) -> None:
        self.failures += 1
        self._unlogged += 1
        self.backoff = min(MAX_BACKOFF, self.backoff * 2) if self.backoff else FIRST_BACKOFF
        now = trio.current_time()
        if now >= self._next_line:
            log.warning(
                "cannot accept client connections: %s (%d failed in the last %.0fs; "
                "retrying in %.1fs)", error.strerror or error, self._unlogged,
                LOG_INTERVAL, self.backoff,
            )  # fmt: skip
            self._unlogged = 0
            self._next_line = now + LOG_INTERVAL

    def accepted(self) -> None:
        """An accept worked: the next failure waits 0.1 s again (the count of failures goes
        on, into the next line; a line saying so, only as often as the others)."""
        if self.backoff:
            self.backoff = 0.0
            now = trio.current_time()
            if now >= self._next_line:
                log.info("accepting client connections again (%d more failed)", self._unlogged)
                self._unlogged = 0
                self._next_line = now + LOG_INTERVAL


async def accept_loop(
    listener: trio.SocketListener, handler: Handler, handler_nursery: trio.Nursery,
    freed: Callable[[], Awaitable[None]] | None = None,
) -> None:  # fmt: skip
    """Accept connections on ``listener`` until cancelled (then close it), each handled by
    ``handler`` in its own task in ``handler_nursery``.  After an accept that failed for lack
    of resources, wait for the back-off, or less if ``freed`` returns first (a client
    connection closed)."""
    errors = AcceptErrors()
    async with listener:  # closed when the loop ends, as trio's closes it
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:
                if error.errno not in CAPACITY_ERRNOS:
                    raise
                errors.failed(error)
                with trio.move_on_after(errors.backoff):
                    if freed is None:
                        await trio.sleep_forever()
                    await freed()
                continue
            errors.accepted()
            handler_nursery.start_soon(handler, stream)


async def serve_listeners(
    handler: Handler, listeners: list[trio.SocketListener], *, handler_nursery: trio.Nursery,
    freed: Callable[[], Awaitable[None]] | None = None,
) -> None:  # fmt: skip
    """``trio.serve_listeners`` (one accept loop per listener) with :func:`accept_loop`'s
    quiet back-off."""
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(accept_loop, listener, handler, handler_nursery, freed)
