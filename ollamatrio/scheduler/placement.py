"""Where a model goes: pure placement decisions, no I/O.

Inputs are a memory estimate, the devices with the memory that is free for *this* load,
and the host's free RAM; the output is a :class:`Placement` or ``None`` when the model
does not fit.  The scheduler calls these on every load decision, so they stay cheap.

Policy (docs/scheduling.md):

1. ``num_gpu == 0`` or no GPUs: CPU only, and the host must have room (Ollama has no such
   check for CPU loads; a CPU load that cannot fit is an eviction or an error, not an OOM).
2. ``main_gpu`` set: that GPU alone.
3. Unless ``spread``: the best single GPU that holds the whole model (discrete before
   integrated, then the one with the most free memory).
4. The smallest group of GPUs of one library that holds the whole model (not Ollama's
   "one GPU or all of them"); with ``spread``, every GPU of the best library.
5. Only when ``allow_partial``: partial offload to the library group that takes the most
   layers, the rest on the CPU; or CPU only.  The host part must fit in host RAM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby

from ..memory import Estimate, Layout, plan_layout


@dataclass(frozen=True)
class DeviceRoom:
    """A GPU and the memory a new load may use on it."""

    id: str
    library: str
    free: int
    integrated: bool = False
    reserve: int = 0  # the runner's GPU context (memory.GPU_CONTEXT_RESERVE)
    factor: float = 1.0  # correction learned from measured loads on this GPU


@dataclass(frozen=True)
class Placement:
    gpu_ids: tuple[str, ...]  # devices the runner may use, in layout order
    num_gpu: int  # layers offloaded
    vram_by_gpu: dict[str, int] = field(default_factory=dict)
    host_bytes: int = 0
    tensor_split: tuple[float, ...] = ()
    fits_fully: bool = False  # every layer on GPUs
    # What the prediction on each used GPU assumed: its context reserve and correction.
    reserve_by_gpu: dict[str, int] = field(default_factory=dict)
    factor_by_gpu: dict[str, float] = field(default_factory=dict)
    prompt_cache: int = 0  # the host prompt cache's limit, part of host_bytes
    draft_on_gpu: bool = False  # the draft model (if any) shares the first GPU

    @property
    def total(self) -> int:
        return self.host_bytes + sum(self.vram_by_gpu.values())

    @property
    def on_cpu_only(self) -> bool:
        return self.num_gpu == 0


def _rank(dev: DeviceRoom) -> tuple[bool, int]:
    # discrete first (False sorts first), then most free memory first
    return (dev.integrated, -dev.free)


def _from_layout(gpus: Sequence[DeviceRoom], layout: Layout) -> Placement:
    used = tuple(g.id for g in gpus if layout.gpu_layers.get(g.id, 0) > 0)
    return Placement(
        gpu_ids=used,
        num_gpu=layout.num_gpu_layers,
        vram_by_gpu={k: v for k, v in layout.vram_by_gpu.items() if v > 0},
        host_bytes=layout.host_bytes,
        tensor_split=tuple(layout.tensor_split) if len(used) > 1 else (),
        fits_fully=layout.fits_fully,
        reserve_by_gpu={g.id: g.reserve for g in gpus if g.id in used},
        factor_by_gpu={g.id: g.factor for g in gpus if g.id in used},
        prompt_cache=layout.prompt_cache,
        draft_on_gpu=layout.draft_on_gpu,
    )


def cpu_placement(estimate: Estimate) -> Placement:
    return Placement(
        gpu_ids=(), num_gpu=0, host_bytes=estimate.total, prompt_cache=estimate.prompt_cache
    )


def choose_placement(
    estimate: Estimate,
    gpus: Sequence[DeviceRoom],
    host_free: int,
    *,
    num_gpu: int = -1,
    main_gpu: int | None = None,
    spread: bool = False,
    gpu_overhead: int = 0,
    allow_partial: bool = True,
) -> Placement | None:
    """Pick a placement that fits, or ``None``."""

    def layout(devs: Sequence[DeviceRoom]) -> Layout:
        return plan_layout(
            estimate,
            [(d.id, d.free) for d in devs],
            gpu_overhead=gpu_overhead,
            num_gpu=num_gpu,
            reserves={d.id: d.reserve for d in devs},
            factors={d.id: d.factor for d in devs},
        )

    def host_ok(p: Placement) -> bool:
        return p.host_bytes <= host_free

    if num_gpu == 0 or not gpus:
        p = cpu_placement(estimate)
        return p if host_ok(p) else None

    if main_gpu is not None and 0 <= main_gpu < len(gpus):
        p = _from_layout([gpus[main_gpu]], layout([gpus[main_gpu]]))
        if host_ok(p) and (p.fits_fully or allow_partial or num_gpu > 0):
            return p
        return None

    ranked = sorted(gpus, key=_rank)
    if not spread:
        for dev in ranked:
            p = _from_layout([dev], layout([dev]))
            if p.fits_fully and host_ok(p):
                return p

    by_library = [
        sorted(devs, key=_rank)
        for _, devs in groupby(sorted(gpus, key=lambda d: d.library), key=lambda d: d.library)
    ]
    # Best library first: one with a discrete GPU, then the most combined free memory.
    by_library.sort(key=lambda devs: (all(d.integrated for d in devs), -sum(d.free for d in devs)))

    if spread:
        p = _from_layout(by_library[0], layout(by_library[0]))
        if host_ok(p) and (p.fits_fully or allow_partial):
            return p
    else:
        best: Placement | None = None
        for devs in by_library:
            for k in range(2, len(devs) + 1):
                p = _from_layout(devs[:k], layout(devs[:k]))
                if p.fits_fully and host_ok(p):
                    if best is None or len(p.gpu_ids) < len(best.gpu_ids):
                        best = p
                    break
        if best is not None:
            return best

    if not allow_partial and num_gpu < 0:
        return None

    # Partial offload: the group that takes the most layers; CPU only as the last resort.
    partial = [_from_layout(devs, layout(devs)) for devs in by_library]
    partial = [p for p in partial if p.num_gpu > 0 and host_ok(p)]
    if partial:
        return max(partial, key=lambda p: p.num_gpu)
    return _cpu_if_fits(estimate, host_free)


def _cpu_if_fits(estimate: Estimate, host_free: int) -> Placement | None:
    p = cpu_placement(estimate)
    return p if p.host_bytes <= host_free else None
