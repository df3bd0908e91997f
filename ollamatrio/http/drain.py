"""Shutdown's last word: requests still running when the drain period ends are told why.

At shutdown the server stops accepting connections and gives running requests a grace
period (``serve.GRACEFUL_TIMEOUT``).  Whatever is still running then is *cut*:

* a request that has no response yet (waiting in the queue, for a load or a slot, or
  generating for ``"stream": false``) answers 503 ``{"error": "server shutting down"}``;
* a stream that is under way ends with one last error line: ``{"error": "server shutting
  down"}`` on NDJSON streams, an OpenAI error event on ``/v1`` (SSE) streams.

Mechanics: every request's work (whatever serves it: the API's request chain, api/chain.py,
holds the guard) runs inside a cancel scope that :meth:`Drain.cut` cancels, so a cut unwinds
the request's own ``async with`` blocks (lease, runner stream, pull channel) exactly as a
client disconnect does, and the chain then writes the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from ..errors import ServerShuttingDownError

log = logging.getLogger(__name__)


class Drain:
    """The cancel scopes of the requests in flight, and the switch that cuts them."""

    def __init__(self) -> None:
        self._scopes: set[trio.CancelScope] = set()
        self.is_cut = False
        # Set when shutdown begins: endless streams (``/api/events``) end then, not at the cut.
        self.stopping = trio.Event()

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Run the block (no ``yield`` of an async generator inside) so that :meth:`cut`
        ends it with :class:`ServerShuttingDownError`."""
        if self.is_cut:
            raise ServerShuttingDownError()
        with trio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                yield
            finally:
                self._scopes.discard(scope)
        if scope.cancelled_caught:
            raise ServerShuttingDownError()

    def cut(self) -> None:
        """End every guarded block now, and any that starts later."""
        self.is_cut = True
        self.stopping.set()
        if self._scopes:
            log.info("shutting down: ending %d requests still running", len(self._scopes))
        for scope in self._scopes:
            scope.cancel()

    async def cut_after(self, stopping: trio.Event, grace: float) -> None:
        """Cut ``grace`` seconds after ``stopping`` is set."""
        await stopping.wait()
        self.stopping.set()
        await trio.sleep(grace)
        self.cut()
