"""What a runner's host prompt cache holds, and a cap on how far it may grow.

llama.cpp's prompt cache (``cache_ram_mib``) copies slot states into host RAM on demand.  The
server books what the cache holds now, not its limit, so it must also stop the cache from
growing into memory that another model was given: the scheduler grants each cache a number
of bytes, and this module makes the runner unable to take more.

The cap is the runner's ``RLIMIT_DATA`` (its private writable memory, ``VmData``), which one
process may set on another of the same user.  Measured with SmolLM2-135M (docs/prompt_cache.md):
every saved state grows ``VmData`` by its size (7.1 MiB for 320 tokens), and an evicted one
gives it back (llama.cpp's state buffers are large enough for glibc to ``mmap`` them); when
a save would pass the cap, llama.cpp catches the failed allocation ("failed to allocate
memory for prompt cache state"), skips the save, lowers its own limit to 40 % of what it
held and drops its oldest states down to that: the runner keeps serving, and the cache gives
memory back.  The lowered limit stays for the runner's life.

What the cache holds is read the same way, as the growth of ``VmData`` since the runner
reported ready: the quantity the cap bounds, and one that falls when states are dropped.
llama.cpp's own count ("cache state: N prompts, X MiB") is logged only above the runner's
default verbosity, and the resident anonymous memory also grows as the KV cache and compute
buffers are first touched, which is not the cache.  The growth includes the runner's other
allocations after ready (1-14 MiB over the first requests, then flat), so it errs on the side
of booking too much.
"""

from __future__ import annotations

import logging
from typing import Final

import psutil

log = logging.getLogger(__name__)

MiB: Final = 1 << 20
# What the runner may grow by beyond the cache's grant, for everything else it allocates after
# ready.  Measured: 1 MiB (one slot) to 14 MiB (two slots, six concurrent requests and
# tokenizations), flat after the first requests; with no room at all a new thread could not
# get its thread-local data and the runner aborted.  A thread's stack alone is 8 MiB.
HEADROOM: Final = 64 * MiB


class PromptCacheAllowance:
    """The prompt cache of the runner ``pid``, whose limit is ``limit`` bytes.

    Create it right after the runner is ready (its cache still empty)."""

    def __init__(self, pid: int, limit: int) -> None:
        self._process = psutil.Process(pid)
        self.limit = limit
        self._ready = self._data()
        self._soft, self._hard = self._process.rlimit(psutil.RLIMIT_DATA)
        self.granted = limit

    def _data(self) -> int:
        # Linux's statm "data": VmData and the main thread's stack (which RLIMIT_DATA leaves
        # out, so the cap sits that much, a few hundred KiB, above the grant).
        return int(self._process.memory_info().data)

    def held(self) -> int:
        """Bytes the cache holds now, as its runner's private memory growth since ready;
        0 once the runner is gone."""
        try:
            return max(0, self._data() - self._ready)
        except psutil.Error:
            return 0

    def grant(self, nbytes: int) -> None:
        """Let the cache hold at most ``nbytes`` from now on.  Less than it holds is allowed:
        its next save fails, and llama.cpp drops states.  At its whole limit the runner is
        not capped at all (llama.cpp keeps the cache within the limit itself)."""
        nbytes = max(0, min(nbytes, self.limit))
        if nbytes == self.granted:
            return
        soft = self._soft if nbytes >= self.limit else self._ready + HEADROOM + nbytes
        if self._hard != psutil.RLIM_INFINITY:
            soft = min(soft, self._hard)
        try:
            self._process.rlimit(psutil.RLIMIT_DATA, (soft, self._hard))
        except psutil.Error as exc:  # gone, or not ours to limit: nothing to cap
            log.debug("cannot cap the prompt cache of runner %d: %s", self._process.pid, exc)
            return
        self.granted = nbytes


def open_allowance(pid: int, limit: int) -> PromptCacheAllowance | None:
    """The allowance of runner ``pid``'s cache, or None when it is gone already (its crash
    is reported by whoever watches the process)."""
    try:
        return PromptCacheAllowance(pid, limit)
    except psutil.Error:
        return None
