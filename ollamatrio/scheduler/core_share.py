"""The scheduler's task that keeps the cores divided among the runners (``cores.py``) as
they start, generate, idle and stop.

It wakes on every change the scheduler signals (a lease taken or given back, a runner
ready or gone), divides, and tells each runner whose share changed (``Engine.use_threads``:
a line on the runner's stdin, acted on from its next token).  While a runner generates it
also reads how many cores other processes keep busy (``devices/cpu_load.py``), a quarter
of a second after it starts and then once a second, and divides what is left.  A change is
logged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable

import trio

from ..devices.cpu_load import CpuElsewhere
from .cores import CoreClaim, divide
from .runner import Runner, RunnerState

log = logging.getLogger(__name__)

READ_EVERY = 1.0  # seconds between two readings of the cores busy elsewhere
FIRST_READ = 0.25  # seconds to the first one once a runner starts generating


class CoreShare:
    def __init__(
        self,
        cores: int,
        runners: Callable[[], Iterable[Runner]],
        *,
        elsewhere: CpuElsewhere | None = None,
    ) -> None:
        self.cores = cores  # the physical cores the server may use
        self.busy_elsewhere = 0  # of them, kept busy by other processes (rounded)
        self._runners = runners
        self._elsewhere = elsewhere
        self._measured = False  # a reading of this stretch of generation measured something
        self._changed = trio.Event()

    def changed(self) -> None:
        """Something the division depends on changed (synchronous, cheap)."""
        self._changed.set()
        self._changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        reading = False  # a first reading is taken: the next one measures from it
        while True:
            changed = self._changed
            generating = await self._divide()
            if generating and self._elsewhere is not None:
                if not reading:
                    # At once, and the first measure soon: a runner that started beside a
                    # busy process is slowed until the division leaves that core alone.
                    self._read_elsewhere()
                    reading = True
                with trio.move_on_after(READ_EVERY if self._measured else FIRST_READ):
                    await changed.wait()
                self._read_elsewhere()
            else:
                if self._elsewhere is not None:
                    self._elsewhere.forget()  # idle time says nothing about the next run
                    reading, self._measured = False, False
                await changed.wait()

    def _read_elsewhere(self) -> None:
        assert self._elsewhere is not None
        pids = [r.engine.pid for r in self._runners() if r.engine is not None and r.engine.pid]
        busy = self._elsewhere.since_last(pids, at_least=FIRST_READ * 0.8)
        if busy is None:
            return
        self._measured = True
        rounded = min(self.cores - 1, math.floor(busy + 0.5))
        if rounded != self.busy_elsewhere:
            log.info("cores busy elsewhere: %d of %d (%.2f measured)", rounded, self.cores, busy)
            self.busy_elsewhere = rounded

    async def _divide(self) -> bool:
        """Apply the division; True if a runner is generating on the CPU."""
        ready = [
            r for r in self._runners() if r.engine is not None and r.state is RunnerState.READY
        ]
        claims = [_claim(r) for r in ready]
        division = divide(self.cores - self.busy_elsewhere, claims)
        changes = []
        for runner in ready:
            engine, threads = runner.engine, division.get(runner.key)
            assert engine is not None
            if threads is not None and threads != engine.threads:
                changes.append(f"{runner.name} {engine.threads} -> {threads}")
                await engine.use_threads(threads)
        if changes:
            log.info(
                "threads: %s (%d cores, %d busy elsewhere)",
                ", ".join(changes),
                self.cores,
                self.busy_elsewhere,
            )
        return any(c.generating and not c.on_gpu for c in claims)


def _claim(runner: Runner) -> CoreClaim:
    engine = runner.engine
    assert engine is not None
    return CoreClaim(
        key=runner.key,
        pool=engine.thread_pool,
        fixed=engine.threads,
        generating=runner.refs - runner.slot_waiters > 0,
        on_gpu=runner.placement.fits_fully and runner.placement.num_gpu > 0,
    )
