"""Progress lines of a streamed generation that waits for its model to load.

Before the first token, such a stream carries lines that say how far the load has got; what
a line looks like is the dialect's (the native streams write theirs with
:meth:`~ollamatrio.api.native.stream.GenerateLines.load_line`), handed in as a
:data:`LoadLine`.  The response starts only when a load is really needed, before the first
line; a request that finds its model loaded pays nothing: no subscription, no task.

Ownership: a :class:`ProgressWriter` task in the request's nursery subscribes to the
scheduler's events before the lease is asked for and writes lines until the lease is
granted; only then, and only after the writer has returned, does the request write again,
so the two never write at once.  Lines are throttled (``MIN_INTERVAL``, ``MIN_SHARE``); the
start and 100 % always go out.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import trio

from ..scheduler import ModelRequest, Scheduler
from ..scheduler.runner import RunnerState
from .relay import Generation

MIN_INTERVAL = 0.25  # seconds between two lines ...
MIN_SHARE = 0.05  # ... unless the load moved on by this share of the total

Write = Callable[[bytes], Awaitable[None]]
# One progress line, in the stream's own dialect: (bytes loaded, bytes in all) -> the line.
LoadLine = Callable[[int, int], bytes]


class LoadAnnouncement:
    """What a stream would announce: its model request, and how its lines are written."""

    def __init__(self, scheduler: Scheduler, request: ModelRequest, line: LoadLine) -> None:
        self.scheduler = scheduler
        self.request = request
        self.line = line

    def needed(self) -> bool:
        scheduler = self.scheduler
        if scheduler.waiting >= scheduler.settings.max_queue:
            return False  # the lease is refused at once: let it answer 503 itself
        return scheduler.load_needed(self.request)


class ProgressWriter:
    """Writes ``loading`` events of one runner key as lines until :meth:`finish`."""

    def __init__(self, announcement: LoadAnnouncement, write: Write) -> None:
        self._announcement = announcement
        self._write = write
        self._stopping = False
        self._waiting: trio.CancelScope | None = None
        self._done = trio.Event()
        self._last = (-1, 0)
        self._last_at = -math.inf

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        scheduler, request = self._announcement.scheduler, self._announcement.request
        try:
            async with scheduler.events.subscribe() as events:
                task_status.started()
                runner = scheduler.runner(request.model_path)
                if runner is not None and runner.state is RunnerState.LOADING:
                    await self._line(*runner.load_progress)  # a load already under way
                while not self._stopping:
                    with trio.CancelScope() as self._waiting:
                        event = await events.receive()
                    if self._waiting.cancelled_caught:
                        break
                    if event.kind == "loading" and event.key == request.key and event.total:
                        await self._line(event.completed or 0, event.total)
        except trio.EndOfChannel:
            pass  # it fell behind and was cut off: no more lines, the lease still comes
        finally:
            self._done.set()

    async def _line(self, completed: int, total: int) -> None:
        now = trio.current_time()
        last_completed, last_total = self._last
        if (completed, total) == self._last:
            return
        soon = now - self._last_at < MIN_INTERVAL
        small = completed - last_completed < MIN_SHARE * total
        if total == last_total and completed < total and soon and small:
            return
        self._last, self._last_at = (completed, total), now
        await self._write(self._announcement.line(completed, total))

    def stop(self) -> None:
        """Write no more lines (synchronous: safe in a cancelled scope)."""
        self._stopping = True
        if self._waiting is not None:
            self._waiting.cancel()

    async def join(self) -> None:
        """Stop, and return once the task no longer writes."""
        self.stop()
        await self._done.wait()

    async def finish(self, total: int) -> None:
        """The lease is granted: stop, then say 100 % (unless the last line did)."""
        await self.join()
        if total and self._last != (total, total):
            self._last = (total, total)
            await self._write(self._announcement.line(total, total))


@asynccontextmanager
async def announcing_load(
    nursery: trio.Nursery,
    announcement: LoadAnnouncement,
    generation: AbstractAsyncContextManager[Generation],
    write: Write,
) -> AsyncIterator[Generation]:
    """``generation``, with progress lines written while its lease waits for the load.  The
    response must have started; the writer runs in ``nursery`` (the request's own)."""
    writer = ProgressWriter(announcement, write)
    await nursery.start(writer.run)  # subscribed before the lease is asked for
    try:
        async with generation as gen:
            await writer.finish(gen.lease.runner.load_progress[1])
            yield gen
    finally:
        # Leaving early (a failed load, shutdown's cut): whoever writes next (the request's
        # last words) must not race a line.  The wait is short: a write in progress, or the
        # request's nursery cancelled on disconnect.
        with trio.CancelScope(shield=True):
            await writer.join()
