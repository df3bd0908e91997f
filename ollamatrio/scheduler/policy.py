"""Placement and eviction policy: what a waiting request gets, decided without I/O.

For one pending request, given the runners the scheduler holds, the devices' free memory
and what earlier requests in the same pass were promised, :func:`decide` answers
:class:`Load` (here), :class:`Evict` (these runners first, then this placement) or
:class:`Fail` (never: too big, or everything resident is pinned).  Which runners go first
is :func:`eviction_order`; which ones a load really needs gone is :func:`minimal_victims`;
whether a resident runner can serve a request as it is, :func:`compatible`; what to try
after a load ran out of memory, :func:`retry_after_oom`.

The scheduler's placement pass calls these and applies the answers (evicting, starting
runners, attaching requests); nothing here changes a runner.  ``placement.py`` below
decides where a model goes on a given set of devices.

Bn codes in this module name Ollama's behaviours, each defined in docs/behaviours.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace

import trio

from ..config import Settings
from ..devices import Inventory
from ..errors import InsufficientMemoryError, ModelLimitError, OllamatrioError, OutOfMemoryError
from ..memory import Estimate, MemoryOptions, draft_bytes, estimate, gpu_context_reserve
from ..model_config import ModelConfig
from .admission import ModelRequest, PendingRequest
from .calibration import VramCalibration
from .events import EvictReason
from .options import LoadOptions, needs_reload
from .placement import DeviceRoom, Placement, choose_placement
from .prompt_cache import prompt_cache_bytes
from .runner import Runner, RunnerState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Load:
    placement: Placement


@dataclass(frozen=True)
class Evict:
    victims: tuple[Runner, ...]  # may be empty: room is already on its way (unloads running)
    reserve: Placement | None  # what the request will take once the victims are gone
    reason: EvictReason = "memory"


@dataclass(frozen=True)
class Fail:
    error: OllamatrioError


Decision = Load | Evict | Fail


def compatible(runner: Runner, request: ModelRequest, load: LoadOptions) -> bool:
    """Whether ``runner`` may serve ``request`` as it is loaded (no reload needed)."""
    return (
        runner.reusable
        and not needs_reload(runner.load, load)
        and runner.adapters == request.adapters
        and runner.projector == request.projector
        and runner.spec.draft_model == (request.draft if load.draft_num_predict > 0 else None)
    )


def retry_after_oom(
    pending: PendingRequest, error: BaseException | None, runners: Iterable[Runner]
) -> bool:
    """B44: after a load OOM, retry once with a smaller automatic context, or after
    evicting every other model.  True when ``pending`` is ready to wait again."""
    if not isinstance(error, OutOfMemoryError) or pending.oom_retried:
        return False
    pending.oom_retried = True
    pending.decided = trio.Event()
    load = pending.load
    if load.num_ctx_auto and load.num_ctx > 4096:
        smaller = 32768 if load.num_ctx > 32768 else 4096
        pending.load = replace(load, num_ctx=smaller, num_batch=min(load.num_batch, smaller))
        log.warning("load ran out of memory; retrying with num_ctx=%d", smaller)
        return True
    if any(r.key != pending.request.key and not r.pinned for r in runners):
        pending.evict_others = True
        log.warning("load ran out of memory; retrying after unloading other models")
        return True
    return False


def decide(
    pending: PendingRequest,
    runners: Collection[Runner],
    inventory: Inventory,
    reserved: Sequence[Placement],
    *,
    settings: Settings,
    models: ModelConfig,
    max_models: int,
    calibration: VramCalibration,
) -> Decision:
    """Where ``pending`` loads, what must go first, or why it never can.  ``runners`` are
    all the scheduler holds (unloading ones included); ``reserved`` is the memory promised
    to earlier requests of this pass that wait for evictions."""
    request, load = pending.request, pending.load
    options = MemoryOptions(
        num_ctx=load.num_ctx,
        num_parallel=load.num_parallel,
        num_batch=load.num_batch,
        kv_cache_type_k=load.kv_cache_types.k,
        kv_cache_type_v=load.kv_cache_types.v,
        flash_attention=settings.flash_attention,  # None: auto, as the runner
        projector=pending.projector,
    )
    if pending.draft_info is not None:
        options = replace(options, draft=draft_bytes(pending.draft_info, options))
    est = estimate(pending.info, options)
    # The host prompt cache's limit goes to the runner; placement books none of it (the
    # cache starts empty), only what it holds once it grows (prompt_cache.py).
    cache = prompt_cache_bytes(
        model_mib=models.lookup(request.name).prompt_cache,
        server_mib=settings.prompt_cache_mib,
        kv_per_slot=est.kv // max(1, est.num_parallel),
        free_ram=inventory.system.free,
        embedding=request.embedding_only,
    )
    est = replace(est, prompt_cache=cache)
    active = [r for r in runners if r.state is not RunnerState.UNLOADING]
    going = {r for r in active if r.evicting}
    staying = [r for r in active if r not in going]
    evictable = [r for r in staying if not r.pinned]
    allowed = allowed_gpus(models, request, inventory)

    def fits(gone: set[Runner], *, partial: bool) -> Placement | None:
        rooms, host = free_room(runners, inventory, gone | going, reserved, calibration)
        if allowed is not None:
            rooms = [room for room in rooms if room.id in allowed]
        return choose_placement(
            est,
            rooms,
            host,
            num_gpu=load.num_gpu,
            main_gpu=load.main_gpu,
            spread=settings.sched_spread,
            gpu_overhead=settings.gpu_overhead,
            allow_partial=partial,
        )

    if pending.evict_others and evictable:
        return Evict(tuple(evictable), fits(set(evictable), partial=True), "oom")

    unloading = len(runners) - len(active)
    # Count limit (B11/B12): runners on their way out still count until they are gone,
    # and so does a slot promised to an earlier request that waits for an eviction.
    promised = 1 if reserved else 0
    if len(runners) + promised >= max_models:
        # Evict one: idle first, soonest to expire first (see eviction_order).
        if going or unloading or promised:
            return Evict((), None, "count")
        order = eviction_order(staying)
        if not order:  # every resident model is pinned: waiting would be forever
            return Fail(all_pinned(request, len(runners), max_models))
        return Evict((order[0],), None, "count")

    if not staying and not going:
        # Alone (B33): anything that fits, partial offload or CPU included.
        placement = fits(set(), partial=True)
        if placement is not None:
            return Load(placement)
        return Fail(too_big(request, est))

    placement = fits(set(), partial=False)
    if placement is not None:
        return Load(placement)
    # Would it sit fully on the GPUs if others made room?  Then evict rather than
    # offload partially (Ollama's requireFull for a second model, B33/B36).
    full_alone = fits(set(evictable), partial=False)
    if full_alone is None:
        placement = fits(set(), partial=True)
        if placement is not None:
            return Load(placement)
    partial = full_alone is None
    victims = minimal_victims(staying, lambda gone: fits(gone, partial=partial))
    if victims is None:
        if going:
            return Evict((), None)  # room is on its way
        pinned = [r for r in staying if r.pinned]
        return Fail(too_big(request, est, pinned))
    return Evict(victims, fits(set(victims), partial=partial))


def minimal_victims(
    candidates: list[Runner], fits: Callable[[set[Runner]], Placement | None]
) -> tuple[Runner, ...] | None:
    """Evict only as many runners as needed, in eviction order, and never one the new
    model would fit without."""
    order = eviction_order(candidates)
    chosen: list[Runner] = []
    for runner in order:
        chosen.append(runner)
        if fits(set(chosen)) is not None:
            break
    else:
        return None
    for runner in reversed(chosen[:-1]):
        rest = [r for r in chosen if r is not runner]
        if fits(set(rest)) is not None:
            chosen = rest
    return tuple(chosen)


def eviction_order(runners: Iterable[Runner]) -> list[Runner]:
    """Idle runners strictly first (a runner still loading for the requests that wait
    for it is not idle); within each group, the one that would expire soonest
    (last use + keep_alive for idle runners, now + keep_alive for busy ones), then the
    least recently used.  With equal keep_alive that is least recently used first.
    Unlike B29 (shortest keep_alive, then file path), a model used a second ago is not
    evicted before one idle for minutes.  A runner that must never be evicted belongs
    out of this order (filtered here, before sorting), not ranked last in it: a pinned
    one."""
    return sorted(
        (r for r in runners if not r.pinned),
        key=lambda r: (r.refs > 0 or r.waiters > 0, r.expiry(), r.last_used),
    )


def allowed_gpus(
    models: ModelConfig, request: ModelRequest, inventory: Inventory
) -> set[str] | None:
    """The GPUs this model may use (its ``gpus`` setting), or None for any of them."""
    configured = models.lookup(request.name)
    if configured.gpus is None:
        return None
    return {gpu.id for gpu in inventory.gpus if configured.allows(gpu)}


def free_room(
    runners: Iterable[Runner],
    inventory: Inventory,
    gone: set[Runner],
    reserved: Iterable[Placement],
    calibration: VramCalibration,
) -> tuple[list[DeviceRoom], int]:
    """Memory a new load may use per GPU and on the host (B32, clamped), as if the
    runners in ``gone`` had already unloaded and the reservations were taken.  A runner's
    host memory is its model's plus what its prompt cache holds now."""
    used: dict[str, int] = {}
    freed: dict[str, int] = {}
    host_used = host_freed = 0
    for runner in runners:
        mem = runner.memory
        bucket = freed if runner in gone else used
        for gpu_id, nbytes in mem.vram_by_gpu.items():
            bucket[gpu_id] = bucket.get(gpu_id, 0) + nbytes
        host = max(0, mem.total - mem.vram) + runner.prompt_cache_held
        if runner in gone:
            host_freed += host
        else:
            host_used += host
    rooms = []
    for gpu in inventory.gpus:
        total_left = max(0, gpu.total - used.get(gpu.id, 0) - freed.get(gpu.id, 0))
        free = min(gpu.free + freed.get(gpu.id, 0), total_left + freed.get(gpu.id, 0))
        free = max(0, free - sum(p.vram_by_gpu.get(gpu.id, 0) for p in reserved))
        rooms.append(
            DeviceRoom(
                gpu.id,
                gpu.library,
                free,
                gpu.integrated,
                reserve=gpu_context_reserve(gpu.library),
                factor=calibration.factor(gpu.id),
            )
        )
    system = inventory.system
    host_free = min(
        system.free + host_freed,
        max(0, system.total - host_used - host_freed) + host_freed,
    )
    host_free = max(0, host_free - sum(p.host_bytes for p in reserved))
    return rooms, host_free


def too_big(
    request: ModelRequest, est: Estimate, pinned: Sequence[Runner] = ()
) -> InsufficientMemoryError:
    names = ", ".join(sorted(r.name for r in pinned))
    held = f" (pinned models are never evicted: {names})" if pinned else ""
    return InsufficientMemoryError(
        f"model {request.name} requires more system memory "
        f"({est.total / 2**30:.1f} GiB) than is available{held}"
    )


def all_pinned(request: ModelRequest, loaded: int, max_models: int) -> ModelLimitError:
    return ModelLimitError(
        f"cannot load {request.name}: the {loaded} loaded models are pinned "
        f"and at most {max_models} may be loaded (OLLAMA_MAX_LOADED_MODELS)"
    )
