"""The runner's share of the CPU cores, changed while it runs.

llama.cpp's CPU backend (the wheel is built with OpenMP) computes each graph (one per
decoded token, one per prompt batch) as an OpenMP parallel region of ``n_threads`` threads,
which spin at the barrier between two operations.  Two runners decoding at once on the same
cores put twice as many spinning threads on them as there are cores, and each barrier waits
for a thread that is not running: both fall to a fraction of a token per second.  The
scheduler divides the cores among the runners that are generating and tells each how many
threads it may use now (a line on its stdin; ``scheduler/core_share.py``).

llama.cpp fixes its thread count at load, so the runner puts a function of its own in the
engine's import slot for libgomp's ``GOMP_parallel``, the call that opens every region, and
lowers the number of threads asked for.  ggml reads the number the region really got
(``omp_get_num_threads``) and splits its work by that, so a region with fewer threads
computes the same result.  Measured (two SmolLM2 runners, 2 cores): 0.3 tokens/s each
uncapped, 36 and 37 capped at one thread each (73 alone at two); the hook costs nothing
measurable alone (docs/scheduling.md).
"""

from __future__ import annotations

import ctypes
import json
import mmap
from typing import Any

from ollamatrio.runner.import_slot import ImportSlotError, import_slot

ENTRY = "GOMP_parallel"  # void GOMP_parallel(void (*fn)(void *), void *data, unsigned, unsigned)
_Parallel = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)
_PROT_READ, _PROT_WRITE = 1, 2


class ThreadShare:
    """How many threads the engine's parallel regions may have now (``limit``)."""

    def __init__(self, opener: Any, threads: int) -> None:
        self.threads = threads  # the engine's own count, the most it asks for
        self.limit = threads
        self.regions = 0  # parallel regions opened (about one per token or prompt batch)
        self.granted = 0  # the threads the last one got
        self._open = opener
        # Kept referenced: the engine calls it through a raw pointer.
        self.hook = _Parallel(self._parallel)

    def set(self, threads: int) -> None:
        self.limit = max(1, min(threads, self.threads))

    def apply(self, line: bytes) -> str | None:
        """Act on one line from the client (``{"threads": n}``); what to log, if anything."""
        try:
            threads = int(json.loads(line)["threads"])
        except (ValueError, TypeError, KeyError) as exc:
            return f"ignored a command: {exc!r}"
        before = self.limit
        self.set(threads)
        return f"threads {before} -> {self.limit}" if self.limit != before else None

    def _parallel(self, fn: int, data: int, num_threads: int, flags: int) -> None:
        # Runs on the engine's thread, with the GIL only for these lines.  Nothing here may
        # raise: ctypes would print the error and return without computing the graph.
        granted = min(num_threads or self.limit, self.limit)
        self.regions += 1
        self.granted = granted
        self._open(fn, data, granted, flags)


def share_threads(engine_path: str, threads: int) -> ThreadShare:
    """Put a :class:`ThreadShare` between the loaded engine at ``engine_path`` and
    ``GOMP_parallel``.  :class:`ImportSlotError` if the engine does not import it (a build
    without OpenMP) or its file is not one the reader knows."""
    slot = import_slot(engine_path, ENTRY)
    # The function the dynamic linker would give the engine: looked up from the engine's
    # handle (its dependencies, in its order), never through the slot, which still holds
    # the lazy-binding stub until the first call, and that stub would overwrite the slot.
    opener = _Parallel((ENTRY, ctypes.CDLL(engine_path)))
    share = ThreadShare(opener, threads)
    hook = ctypes.cast(share.hook, ctypes.c_void_p).value
    _write_slot(slot, hook)
    return share


def _write_slot(slot: ctypes.c_void_p, value: int | None) -> None:
    """Write the slot, making its page writable for the write if it is read-only (a slot
    bound at load and protected afterwards: RELRO)."""
    address = ctypes.addressof(slot)
    page = address & ~(mmap.PAGESIZE - 1)
    if _writable(address):
        slot.value = value
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    if libc.mprotect(page, mmap.PAGESIZE, _PROT_READ | _PROT_WRITE) != 0:
        raise ImportSlotError(f"cannot make the import slot writable (errno {ctypes.get_errno()})")
    try:
        slot.value = value
    finally:
        libc.mprotect(page, mmap.PAGESIZE, _PROT_READ)


def _writable(address: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, permissions = line.split()[:2]
            start, end = (int(part, 16) for part in span.split("-"))
            if start <= address < end:
                return "w" in permissions
    raise ImportSlotError(f"address {address:#x} is not mapped")
