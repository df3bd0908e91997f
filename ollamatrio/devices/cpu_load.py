"""How many cores processes other than the server and its runners keep busy (Linux).

A runner with a thread per core beside one busy process has a thread waiting for a core
at every barrier, as with two runners: SmolLM2 fell from 70 to 23 tokens/s at two threads
beside one, and ran at 46 with one thread (docs/scheduling.md).  So the cores the scheduler
divides are the server's less those kept busy elsewhere.

The kernel tells nobody when another process starts computing, so this compares two
readings of the CPU time spent: the CPUs' (``/proc/stat``, the CPUs this process may run on)
less the server's and its runners' own (``/proc/<pid>/stat``).  The scheduler reads it once
a second, and only while a runner generates (``scheduler/core_share.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


class CpuElsewhere:
    """Cores kept busy by other processes, from one reading to the next.

    ``cores`` is the budget the result is given in (the physical cores the server may use):
    busy logical CPUs count as their share of it, so two hyperthreads make one core."""

    def __init__(self, cores: int, *, proc: Path = _PROC) -> None:
        self._proc = proc
        try:
            self._cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self._cpus = list(range(os.cpu_count() or 1))
        self._scale = cores / max(1, len(self._cpus))
        self._last: tuple[float, float, float] | None = None

    def forget(self) -> None:
        """Start afresh: the next reading has nothing to compare with."""
        self._last = None

    def since_last(self, pids: Iterable[int], *, at_least: float) -> float | None:
        """Cores busy elsewhere since the previous reading (None: no previous reading, or it
        is not ``at_least`` seconds old; the previous one is then kept)."""
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < at_least:
            return None
        busy, ours = self._busy_seconds(), self._seconds_of(pids)
        last, self._last = self._last, (now, busy, ours)
        if last is None:
            return None
        elapsed = now - last[0]
        others = (busy - last[1]) - (ours - last[2])
        return max(0.0, others / elapsed * self._scale) if elapsed > 0 else None

    def _busy_seconds(self) -> float:
        wanted = {f"cpu{n}" for n in self._cpus}
        busy = 0
        try:
            lines = (self._proc / "stat").read_text().splitlines()
        except OSError:
            return 0.0
        for line in lines:
            name, *fields = line.split()
            if name in wanted:
                # user nice system idle iowait irq softirq steal (guest is within user)
                ticks = [int(f) for f in fields[:8]]
                busy += sum(ticks) - ticks[3] - ticks[4]
        return busy / _TICKS

    def _seconds_of(self, pids: Iterable[int]) -> float:
        total = 0
        for pid in {os.getpid(), *pids}:
            try:
                text = (self._proc / str(pid) / "stat").read_text()
            except OSError:
                continue  # gone since: its time no longer counts on either side
            fields = text[text.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        return total / _TICKS
