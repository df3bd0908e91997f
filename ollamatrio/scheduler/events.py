"""What the scheduler tells the world: a stream of typed events.

The scheduler publishes synchronously, in the same stretch of code that changes its state,
so an event is never out of order with the state ``ps()`` shows.  Two kinds of consumer:

* **Listeners** (``add_listener``) are plain functions called in the publishing stretch.
  They must be cheap and must not raise: metrics counters are the use.
* **Subscribers** (``async with hub.subscribe() as events``) get a bounded memory channel
  each, for ``/api/events`` and CLIs.  A subscriber that falls ``SUBSCRIBER_BUFFER``
  events behind is cut off (its channel just ends) rather than slowing the
  scheduler or growing without bound; it can subscribe again and read ``ps()`` afresh.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import trio

log = logging.getLogger(__name__)

SUBSCRIBER_BUFFER = 1024

EventKind = Literal[
    "queued",  # a request waits for a model to load (or for room to load it)
    "loading",  # a runner starts loading; ``completed``/``total`` as bytes arrive
    "loaded",  # a runner is ready; ``seconds`` is how long the load took
    "load_failed",  # a load did not finish; ``reason``: error, oom, abandoned
    "evicting",  # a runner will unload once idle; ``reason`` says why
    "expired",  # an idle runner reached its keep_alive
    "crashed",  # a ready runner's process died
    "unloaded",  # a runner's process is gone and its memory free
]

# Why a runner is evicted (``evicting``'s reason): another model needs its memory, the
# loaded-model count is full, a request asked (unload / keep_alive 0), a request needs it
# reloaded with other options, or a load ran out of memory and idle models make way.
EvictReason = Literal["memory", "count", "request", "reload", "oom"]


@dataclass(frozen=True)
class SchedulerEvent:
    kind: EventKind
    model: str  # the model's name as requested
    key: str  # the runner key (model file, plus a suffix for embedding mode)
    reason: str | None = None
    completed: int | None = None  # load progress, bytes
    total: int | None = None
    seconds: float | None = None  # load time (loaded)
    queued: int | None = None  # requests waiting for this model (queued)
    phases: Mapping[str, float] | None = None  # seconds per load phase (loaded)
    at: float = field(default_factory=time.time)  # wall clock

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"event": self.kind, "model": self.model, "at": self.at}
        for name in ("reason", "completed", "total", "seconds", "queued"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        if self.phases is not None:
            body["phases"] = dict(self.phases)
        return body


Listener = Callable[[SchedulerEvent], None]


class EventHub:
    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._subscribers: set[trio.MemorySendChannel[SchedulerEvent]] = set()
        self._membership = trio.Event()  # swapped whenever a subscriber comes or goes

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    async def wait_subscribers(self, count: int) -> None:
        """Wait until ``count`` subscribers are left (tests, dashboards of the server)."""
        while len(self._subscribers) != count:
            await self._membership.wait()

    def _drop(self, send: trio.MemorySendChannel[SchedulerEvent]) -> None:
        if send in self._subscribers:
            self._subscribers.discard(send)
            self._changed_membership()
        send.close()

    def _changed_membership(self) -> None:
        self._membership.set()
        self._membership = trio.Event()

    def publish(self, event: SchedulerEvent) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a metrics bug must not break scheduling
                log.exception("scheduler event listener failed")
        for send in list(self._subscribers):
            try:
                send.send_nowait(event)
            except trio.WouldBlock:
                log.warning("an event subscriber fell %d events behind; cut off", SUBSCRIBER_BUFFER)
                self._drop(send)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._drop(send)

    @asynccontextmanager
    async def subscribe(
        self, buffer: int = SUBSCRIBER_BUFFER
    ) -> AsyncIterator[trio.MemoryReceiveChannel[SchedulerEvent]]:
        """Events published from now until the block exits.  The channel ends early
        (iteration stops) if this subscriber lags ``buffer`` events behind."""
        send, receive = trio.open_memory_channel[SchedulerEvent](buffer)
        self._subscribers.add(send)
        self._changed_membership()
        try:
            async with receive:
                yield receive
        finally:
            self._drop(send)
