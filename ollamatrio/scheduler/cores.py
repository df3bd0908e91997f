"""How many CPU threads each runner may use now: the cores divided among the runners that
are generating (pure; docs/scheduling.md, "Sharing the cores").

llama.cpp's threads spin at the barrier between the operations of a token, so two runners
with a thread per core each, decoding at once, wait on threads that are not running and
fall to a fraction of a token per second.  Divided (one core each of two), each decodes
at its one-thread speed: about half of its alone speed each, the cores fully used.

The rule:

* The cores are the physical cores the server may use, less those other processes keep
  busy (rounded; ``core_share.py`` measures them).
* A runner generating with a fixed thread count (an explicit ``num_thread``, or an engine
  that cannot change its count) takes its count off the cores first.
* The runners generating on the CPU divide the rest evenly, the first loaded taking the
  odd cores, each at least one thread and at most its thread pool.
* A runner not generating gets what it would get if it started now, so its first token
  does not wait for the division to change; with nothing generating that is all the cores.
* A runner with every layer on GPUs needs a thread to feed them, not the cores: one while
  CPU runners generate, its pool otherwise (llama.cpp's own count, measured on GPU
  machines only).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CoreClaim:
    """One runner, as the division sees it."""

    key: str
    pool: int  # threads it was loaded with: the most it can use; 0 = its count is fixed
    fixed: int  # with ``pool`` 0: the threads it uses whatever it is told (0: unknown)
    generating: bool
    on_gpu: bool = False  # every layer on GPUs


def divide(cores: int, claims: Sequence[CoreClaim]) -> dict[str, int]:
    """Threads per runner key, for every claim with a pool (fixed ones are not told)."""
    cpu = [c for c in claims if c.pool and not c.on_gpu]
    busy = [c for c in cpu if c.generating]
    fixed = sum(c.fixed for c in claims if not c.pool and c.generating and not c.on_gpu)
    room = max(0, cores - fixed)
    shares = _even(room, len(busy))
    threads = {c.key: min(c.pool, share) for c, share in zip(busy, shares, strict=True)}
    newcomer = _even(room, len(busy) + 1)[-1]  # what one more would get
    for claim in cpu:
        threads.setdefault(claim.key, min(claim.pool, newcomer))
    cpu_busy = bool(busy) or fixed > 0
    for claim in claims:
        if claim.pool and claim.on_gpu:
            threads[claim.key] = 1 if cpu_busy else claim.pool
    return threads


def _even(room: int, count: int) -> list[int]:
    """``room`` threads split over ``count`` runners, the odd ones to the first; at least
    one each, since a runner cannot stop (the OS shares the cores among the singles)."""
    if count == 0:
        return []
    base, odd = divmod(room, count)
    return [max(1, base + (1 if index < odd else 0)) for index in range(count)]
