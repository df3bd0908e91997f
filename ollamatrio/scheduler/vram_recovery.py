"""VRAM recovery (B55): a stopped runner's GPU memory stays booked until the driver shows
it free again.

Drivers report freed VRAM late, so a runner that has exited still counts against its
GPUs until most of its memory reappears as free, or a bounded wait has passed.  The
runner task measures the baseline just before the runner stops and waits here, shielded,
before it leaves the scheduler's books.  The driver's free-memory figure is external state
with no notification, so this is the one place in the scheduler that polls.

Bn codes in this module name Ollama's behaviours, each defined in docs/behaviours.md.
"""

from __future__ import annotations

import trio

from ..devices import DeviceSource
from .runner import Runner

VRAM_RECOVERY_TIMEOUT = 5.0  # B55
VRAM_RECOVERY_POLL = 0.25
VRAM_RECOVERY_FRACTION = 0.75


async def gpu_free(devices: DeviceSource, runner: Runner) -> int:
    """Free memory now on the GPUs ``runner`` uses."""
    inventory = await devices.inventory()
    return sum(g.free for g in inventory.gpus if g.id in runner.memory.vram_by_gpu)


async def wait_for_vram_recovery(devices: DeviceSource, runner: Runner, baseline: int) -> None:
    """Return once most of ``runner``'s VRAM shows up as free above ``baseline`` (bounded;
    the subtraction is clamped where Ollama's unsigned one wraps)."""
    target = VRAM_RECOVERY_FRACTION * runner.memory.vram
    with trio.move_on_after(VRAM_RECOVERY_TIMEOUT):
        while True:
            if max(0, await gpu_free(devices, runner) - baseline) >= target:
                return
            await trio.sleep(VRAM_RECOVERY_POLL)
