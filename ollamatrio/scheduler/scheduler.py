"""The scheduler: which models are resident, where, and who waits for what.

Shape (docs/scheduling.md):

* ``async with open_scheduler(settings) as sched`` owns a nursery: one task per runner
  (its whole life: load, serve, expire, unload) and one placement task.
* ``async with sched.lease(request) as lease`` hands out a runner.  The refcount rises
  with no checkpoint after it and falls synchronously when the block exits, also by
  cancellation, so a client that disconnects never leaks a lease.
* A request for a loaded model takes the fast path: no queue, no placement task.
  Everything else joins the pending list; the placement task walks it in arrival order
  whenever something changes.  A request that can be served now (it fits in free memory)
  never waits behind one that needs an eviction; requests that need evictions are served
  in arrival order, and the memory they wait for is reserved for them.
* Every waiting request, including one waiting for a parallel slot of a loaded model,
  counts against ``OLLAMA_MAX_QUEUE``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import trio

from .. import model_info
from ..config import Settings
from ..devices import DeviceSource, Inventory, open_device_source
from ..engines.protocol import Engine, EngineFactory
from ..errors import (
    GGUFError,
    InsufficientMemoryError,
    ModelLimitError,
    ModelNotFoundError,
    OllamatrioError,
    OutOfMemoryError,
    QueueFullError,
    RunnerError,
    RunnerStartError,
    SchedulerClosedError,
)
from ..gguf import GGUFInfo
from ..memory import Estimate, MemoryOptions, estimate, gpu_context_reserve
from ..model_config import ModelConfig
from ..types import LoadSpec
from .calibration import VramCalibration
from .events import EventHub, EvictReason, SchedulerEvent
from .options import LoadOptions, default_context_length, needs_reload, resolve_load_options
from .placement import DeviceRoom, Placement, choose_placement
from .runner import Runner, RunnerInfo, RunnerState

log = logging.getLogger(__name__)

VRAM_RECOVERY_TIMEOUT = 5.0  # B55
EMBEDDING_KEY_SUFFIX = "#embedding"
VRAM_RECOVERY_POLL = 0.25
VRAM_RECOVERY_FRACTION = 0.75


@dataclass(frozen=True)
class ModelRequest:
    """What a request wants loaded.  ``options`` are the merged model + request options."""

    name: str
    model_path: str
    options: Mapping[str, Any] = field(default_factory=dict)
    keep_alive: float | None = None  # None: keep the runner's current value
    adapters: tuple[str, ...] = ()
    projector: str | None = None
    embedding_only: bool = False
    shift: bool | None = None  # context shift (B27); None: the default for the model
    chat_template: str | None = None
    digest: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Runners are shared by file (B2) and mode: a chat model asked for embeddings gets
        a runner of its own, loaded in embedding mode."""
        return self.model_path + EMBEDDING_KEY_SUFFIX if self.embedding_only else self.model_path


@dataclass
class Lease:
    """What ``Scheduler.lease`` yields: a ready engine and how long this request waited."""

    runner: Runner
    load_duration: float  # seconds spent waiting for a load (Ollama's load_duration)
    waited: float = 0.0  # seconds from asking to holding a slot: queue, load and slot waits

    @property
    def engine(self) -> Engine:
        assert self.runner.engine is not None
        return self.runner.engine


class _Pending:
    """A request waiting for the placement task to find it a runner."""

    def __init__(self, request: ModelRequest, info: GGUFInfo, load: LoadOptions) -> None:
        self.request = request
        self.info = info
        self.load = load
        self.runner: Runner | None = None  # set when attached to a (loading or ready) runner
        self.error: BaseException | None = None
        self.decided = trio.Event()
        self.evict_others = False  # B44: retry after evicting everything else
        self.oom_retried = False

    def attach(self, runner: Runner) -> None:
        self.runner = runner
        runner.add_waiter()
        self.decided.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.decided.set()


@dataclass(frozen=True)
class _Load:
    placement: Placement


@dataclass(frozen=True)
class _Evict:
    victims: tuple[Runner, ...]  # may be empty: room is already on its way (unloads running)
    reserve: Placement | None  # what the request will take once the victims are gone
    reason: EvictReason = "memory"


@dataclass(frozen=True)
class _Fail:
    error: OllamatrioError


class Scheduler:
    def __init__(
        self,
        settings: Settings,
        engines: EngineFactory,
        devices: DeviceSource,
        nursery: trio.Nursery,
        models: ModelConfig | None = None,
    ) -> None:
        self.settings = settings
        self.models = models or ModelConfig()  # per-model settings (OLLAMATRIO_CONFIG)
        self._engines = engines
        self._devices = devices
        self._nursery = nursery
        self._runners: dict[str, Runner] = {}
        self._pending: deque[_Pending] = deque()
        self._waiting = 0  # requests waiting anywhere: queue, load, slot
        self._wakeup = trio.Event()  # the placement task's
        self._changed = trio.Event()  # anyone else's (I4: swapped on every change)
        self._closed = False
        # Frozen from the first inventory in open_scheduler (B11, B15).
        self._max_models = settings.max_loaded_models
        self._default_ctx = default_context_length(settings.context_length, 0)
        self.calibration = VramCalibration()
        # Wall-clock seconds of recent placement passes (benchmarks, metrics).
        self.pass_seconds: deque[float] = deque(maxlen=4096)
        self.events = EventHub()

    # -- public API ---------------------------------------------------------------------

    @asynccontextmanager
    async def lease(self, request: ModelRequest) -> AsyncIterator[Lease]:
        started = trio.current_time()
        runner = await self._acquire(request)  # returns with refs already +1
        try:
            load_duration = max(0.0, runner.loaded_at - started)
            try:
                runner.slots.acquire_nowait()
            except trio.WouldBlock:
                await self._wait_for_slot(runner)
            waited = trio.current_time() - started
            try:
                yield Lease(runner=runner, load_duration=load_duration, waited=waited)
            except OutOfMemoryError:
                self._expire_idle_runners()  # B50
                raise
            finally:
                runner.slots.release()
        finally:
            runner.unpin()

    async def load(self, request: ModelRequest) -> Lease:
        """Load (or reuse) a model and release it at once: Ollama's empty-prompt request (B24)."""
        async with self.lease(request) as lease:
            return lease

    def unload(self, model_path: str) -> bool:
        """Expire a model (its runners in every mode) now, or as soon as their requests
        finish (B23).  True if it was loaded."""
        unloaded = False
        for runner in list(self._runners.values()):
            if runner.spec.model_path != model_path or runner.state is RunnerState.UNLOADING:
                continue
            unloaded = True
            self._evict(runner, "request")
            if runner.state is RunnerState.LOADING and runner.waiters == 0 and runner.refs == 0:
                runner.scope.cancel()
        return unloaded

    def unload_all(self) -> None:
        for runner in list(self._runners.values()):
            self.unload(runner.spec.model_path)

    def ps(self) -> list[RunnerInfo]:
        """Every runner, latest expiry first (B65): loading, ready and unloading (until its
        process has exited and its memory is free again).  A runner's ``queued`` includes
        the pending requests for its model file that it has not taken yet."""
        pending: dict[str, int] = {}
        for p in self._pending:
            pending[p.request.key] = pending.get(p.request.key, 0) + 1
        infos = [r.info(pending.get(key, 0)) for key, r in self._runners.items()]
        return sorted(
            infos, key=lambda i: math.inf if i.expires_at is None else i.expires_at, reverse=True
        )

    def runners(self) -> list[Runner]:
        """Every runner the scheduler holds (loading, ready, unloading); for metrics."""
        return list(self._runners.values())

    def runner(self, model_path: str, *, embedding: bool | None = None) -> Runner | None:
        """The resident (or loading) runner for a model file, if any: in embedding mode or
        not as ``embedding`` says, or either (the generation one first)."""
        plain = self._runners.get(model_path) if not embedding else None
        if plain is not None or embedding is False:
            return plain
        return self._runners.get(model_path + EMBEDDING_KEY_SUFFIX)

    def load_needed(self, request: ModelRequest) -> bool:
        """Whether a lease for ``request`` would wait for a load, as far as can be told now
        (the lease's fast path, without taking it)."""
        runner = self._runners.get(request.key)
        if runner is None or runner.state is not RunnerState.READY:
            return True
        info = model_info.cached(request.model_path)
        return info is None or not self._compatible(
            runner, request, self._load_options(request, info)
        )

    def queue_depth(self) -> dict[str, int]:
        depth: dict[str, int] = {}
        for p in self._pending:
            depth[p.request.name] = depth.get(p.request.name, 0) + 1
        for r in self._runners.values():
            if r.waiters or r.slot_waiters:
                depth[r.name] = depth.get(r.name, 0) + r.waiters + r.slot_waiters
        return depth

    @property
    def waiting(self) -> int:
        return self._waiting

    async def wait_idle(self) -> None:
        """Wait until no runner is resident (tests and shutdown)."""
        while self._runners:
            await self._next_change()

    # -- acquiring a runner -------------------------------------------------------------

    async def _acquire(self, request: ModelRequest) -> Runner:
        if self._closed:
            raise SchedulerClosedError("scheduler is shutting down")
        info = model_info.cached(request.model_path)
        if info is None:
            info = await self._read_model(request.model_path)
        load = self._load_options(request, info)

        runner = self._runners.get(request.key)
        ready = runner is not None and runner.state is RunnerState.READY
        if ready and self._compatible(runner, request, load):
            runner.pin(request.keep_alive)  # fast path (B3): no checkpoint after this
            return runner

        pending = _Pending(request, info, load)
        self._admit()
        self._publish("queued", request.name, request.key, queued=self._queued_for(request.key) + 1)
        try:
            while True:
                self._pending.append(pending)
                self._wake()
                await pending.decided.wait()
                runner = pending.runner
                if pending.error is not None:
                    raise pending.error
                assert runner is not None
                pending.runner = None
                try:
                    await runner.loaded.wait()
                finally:
                    runner.remove_waiter()
                if runner.state is RunnerState.READY and runner.error is None:
                    runner.pin(request.keep_alive)
                    return runner
                if not self._prepare_retry(pending, runner.error):
                    assert runner.error is not None
                    raise runner.error
        except BaseException:
            self._forget(pending)
            raise
        finally:
            self._waiting -= 1

    def _queued_for(self, key: str) -> int:
        runner = self._runners.get(key)
        waiting = runner.waiters + runner.slot_waiters if runner is not None else 0
        return waiting + sum(1 for p in self._pending if p.request.key == key)

    def _publish(self, kind: Any, model: str, key: str, **fields: Any) -> None:
        self.events.publish(SchedulerEvent(kind, model, key, **fields))

    def _evict(self, runner: Runner, reason: EvictReason) -> None:
        if not runner.evicting and runner.state is not RunnerState.UNLOADING:
            self._publish("evicting", runner.name, runner.key, reason=reason)
        runner.evict()

    def _admit(self) -> None:
        if self._waiting >= self.settings.max_queue:
            raise QueueFullError()
        self._waiting += 1

    async def _wait_for_slot(self, runner: Runner) -> None:
        self._admit()
        runner.slot_waiters += 1
        try:
            await runner.slots.acquire()
        finally:
            runner.slot_waiters -= 1
            self._waiting -= 1

    def _forget(self, pending: _Pending) -> None:
        """A waiting request went away (cancelled or failed): leave nothing behind."""
        try:
            self._pending.remove(pending)
        except ValueError:
            pass
        runner = pending.runner
        if runner is not None:  # decided, but the request never got to wait on the load
            runner.remove_waiter()
            pending.runner = None
            runner.abandon_load_if_unwanted()
        for r in self._runners.values():
            r.abandon_load_if_unwanted()

    def _prepare_retry(self, pending: _Pending, error: BaseException | None) -> bool:
        """B44: after a load OOM, retry once with a smaller automatic context, or after
        evicting every other model."""
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
        if any(r.key != pending.request.key and not r.pinned for r in self._runners.values()):
            pending.evict_others = True
            log.warning("load ran out of memory; retrying after unloading other models")
            return True
        return False

    async def _read_model(self, path: str) -> GGUFInfo:
        try:
            return await model_info.read_model_info(path)
        except FileNotFoundError:
            raise ModelNotFoundError(f"model file {path} not found") from None
        except GGUFError as exc:
            raise RunnerStartError(str(exc)) from exc

    async def _freeze_limits(self) -> None:
        """B11/B15: the default context and the automatic model count come from the GPUs
        seen at start, the same for every model (GPU hot-plug is not followed)."""
        inventory = await self._devices.inventory()
        if self._max_models <= 0:
            self._max_models = 3 * max(1, len(inventory.gpus))
        self._default_ctx = default_context_length(
            self.settings.context_length,
            sum(g.total for g in inventory.gpus),
            self.settings.gpu_overhead,
        )
        for name, configured in self.models.models.items():
            if configured.gpus and not any(configured.allows(g) for g in inventory.gpus):
                log.warning("model %s: none of its gpus %s is present; it will run on the CPU",
                            name, list(configured.gpus))  # fmt: skip

    @property
    def default_context_length(self) -> int:
        """The ``num_ctx`` a model gets when nothing asks for one."""
        return self._default_ctx

    @property
    def max_loaded_models(self) -> int:
        return self._max_models

    def _load_options(self, request: ModelRequest, info: GGUFInfo) -> LoadOptions:
        # The model's configured values stand in for the server-wide ones; the request's
        # options (model parameters included) still win.
        configured = self.models.lookup(request.name)
        return resolve_load_options(
            request.options,
            default_num_ctx=configured.num_ctx or self._default_ctx,
            context_length_configured=(
                self.settings.context_length > 0 or configured.num_ctx is not None
            ),
            train_ctx=info.context_length,
            num_parallel=configured.num_parallel or self.settings.num_parallel,
            embedding_only=request.embedding_only,
            architecture=info.architecture,
            has_projector=request.projector is not None,
            shift=request.shift,
        )

    @staticmethod
    def _compatible(runner: Runner, request: ModelRequest, load: LoadOptions) -> bool:
        return (
            runner.reusable
            and not needs_reload(runner.load, load)
            and runner.adapters == request.adapters
            and runner.projector == request.projector
        )

    def _expire_idle_runners(self) -> None:
        for runner in self._runners.values():
            if not runner.pinned:
                self._evict(runner, "oom")

    # -- the placement task -------------------------------------------------------------

    def _wake(self) -> None:
        self._wakeup.set()
        self._changed.set()
        self._changed = trio.Event()

    async def _next_change(self) -> None:
        await self._changed.wait()

    async def _placement_loop(self, *, task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            if not self._pending:
                continue
            inventory = await self._devices.inventory()
            self._place_pending(inventory)

    def _place_pending(self, inventory: Inventory) -> None:
        """One synchronous pass over the waiting requests, in arrival order."""
        started = time.perf_counter()
        try:
            self._place_pending_pass(inventory)
        finally:
            self.pass_seconds.append(time.perf_counter() - started)

    def _place_pending_pass(self, inventory: Inventory) -> None:
        reserved: list[Placement] = []  # promised to the request that waits for evictions
        eviction_in_progress = False
        waiting_keys: set[str] = set()  # decided "wait" in this pass: same answer for the rest
        remaining: deque[_Pending] = deque()
        for pending in self._pending:
            request = pending.request
            runner = self._runners.get(request.key)
            if runner is not None:
                if self._compatible(runner, request, pending.load) and not pending.evict_others:
                    pending.attach(runner)
                    continue
                remaining.append(pending)
                if runner.state is RunnerState.UNLOADING or runner.evicting:
                    continue  # the old one is on its way out; decide when it is gone
                # Loaded with other options: it must go first (B25), in arrival order.
                if not eviction_in_progress:
                    eviction_in_progress = True
                    self._evict(runner, "reload")
                continue
            if request.key in waiting_keys and not pending.evict_others:
                remaining.append(pending)
                continue

            decision = self._decide(pending, inventory, reserved)
            if isinstance(decision, _Fail):
                pending.fail(decision.error)
            elif isinstance(decision, _Load):
                runner = self._start_runner(pending, decision.placement)
                pending.attach(runner)
            else:
                remaining.append(pending)
                waiting_keys.add(request.key)
                if not eviction_in_progress:
                    eviction_in_progress = True
                    pending.evict_others = False
                    for victim in decision.victims:
                        log.info("evicting %s to make room for %s", victim.name, request.name)
                        self._evict(victim, decision.reason)
                    reserved.append(decision.reserve or Placement(gpu_ids=(), num_gpu=0))
        self._pending = remaining

    def _decide(
        self, pending: _Pending, inventory: Inventory, reserved: Sequence[Placement]
    ) -> _Load | _Evict | _Fail:
        request, load = pending.request, pending.load
        est = estimate(
            pending.info,
            MemoryOptions(
                num_ctx=load.num_ctx,
                num_parallel=load.num_parallel,
                num_batch=load.num_batch,
                kv_cache_type=self.settings.kv_cache_type,
                flash_attention=self.settings.flash_attention,  # None: auto, as the runner
            ),
        )
        active = [r for r in self._runners.values() if r.state is not RunnerState.UNLOADING]
        going = {r for r in active if r.evicting}
        staying = [r for r in active if r not in going]
        evictable = [r for r in staying if not r.pinned]
        allowed = self._allowed_gpus(request, inventory)

        def fits(gone: set[Runner], *, partial: bool) -> Placement | None:
            rooms, host = self._room(inventory, gone | going, reserved)
            if allowed is not None:
                rooms = [room for room in rooms if room.id in allowed]
            return choose_placement(
                est,
                rooms,
                host,
                num_gpu=load.num_gpu,
                main_gpu=load.main_gpu,
                spread=self.settings.sched_spread,
                gpu_overhead=self.settings.gpu_overhead,
                allow_partial=partial,
            )

        if pending.evict_others and evictable:
            return _Evict(tuple(evictable), fits(set(evictable), partial=True), "oom")

        unloading = len(self._runners) - len(active)
        # Count limit (B11/B12): runners on their way out still count until they are gone,
        # and so does a slot promised to an earlier request that waits for an eviction.
        promised = 1 if reserved else 0
        if len(self._runners) + promised >= self._max_models:
            # Evict one: idle first, soonest to expire first (see _eviction_order).
            if going or unloading or promised:
                return _Evict((), None, "count")
            victims = self._eviction_order(staying)
            if not victims:  # every resident model is pinned: waiting would be forever
                return _Fail(self._all_pinned(request))
            return _Evict((victims[0],), None, "count")

        if not staying and not going:
            # Alone (B33): anything that fits, partial offload or CPU included.
            placement = fits(set(), partial=True)
            if placement is not None:
                return _Load(placement)
            return _Fail(self._too_big(request, est))

        placement = fits(set(), partial=False)
        if placement is not None:
            return _Load(placement)
        # Would it sit fully on the GPUs if others made room?  Then evict rather than
        # offload partially (Ollama's requireFull for a second model, B33/B36).
        full_alone = fits(set(evictable), partial=False)
        if full_alone is None:
            placement = fits(set(), partial=True)
            if placement is not None:
                return _Load(placement)
        partial = full_alone is None
        victims = self._minimal_victims(staying, lambda gone: fits(gone, partial=partial))
        if victims is None:
            if going:
                return _Evict((), None)  # room is on its way
            pinned = [r for r in staying if r.pinned]
            return _Fail(self._too_big(request, est, pinned))
        return _Evict(victims, fits(set(victims), partial=partial))

    def _minimal_victims(self, candidates: list[Runner], fits: Any) -> tuple[Runner, ...] | None:
        """Evict only as many runners as needed, in eviction order, and never one the new
        model would fit without."""
        order = self._eviction_order(candidates)
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

    @staticmethod
    def _eviction_order(runners: Iterable[Runner]) -> list[Runner]:
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

    def _allowed_gpus(self, request: ModelRequest, inventory: Inventory) -> set[str] | None:
        """The GPUs this model may use (its ``gpus`` setting), or None for any of them."""
        configured = self.models.lookup(request.name)
        if configured.gpus is None:
            return None
        return {gpu.id for gpu in inventory.gpus if configured.allows(gpu)}

    def _room(
        self, inventory: Inventory, gone: set[Runner], reserved: Iterable[Placement]
    ) -> tuple[list[DeviceRoom], int]:
        """Memory a new load may use per GPU and on the host (B32, clamped), as if the
        runners in ``gone`` had already unloaded and the reservations were taken."""
        used: dict[str, int] = {}
        freed: dict[str, int] = {}
        host_used = host_freed = 0
        for runner in self._runners.values():
            mem = runner.memory
            bucket = freed if runner in gone else used
            for gpu_id, nbytes in mem.vram_by_gpu.items():
                bucket[gpu_id] = bucket.get(gpu_id, 0) + nbytes
            host = max(0, mem.total - mem.vram)
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
                    factor=self.calibration.factor(gpu.id),
                )
            )
        system = inventory.system
        host_free = min(
            system.free + host_freed,
            max(0, system.total - host_used - host_freed) + host_freed,
        )
        host_free = max(0, host_free - sum(p.host_bytes for p in reserved))
        return rooms, host_free

    @staticmethod
    def _too_big(
        request: ModelRequest, est: Estimate, pinned: Sequence[Runner] = ()
    ) -> InsufficientMemoryError:
        names = ", ".join(sorted(r.name for r in pinned))
        held = f" (pinned models are never evicted: {names})" if pinned else ""
        return InsufficientMemoryError(
            f"model {request.name} requires more system memory "
            f"({est.total / 2**30:.1f} GiB) than is available{held}"
        )

    def _all_pinned(self, request: ModelRequest) -> ModelLimitError:
        return ModelLimitError(
            f"cannot load {request.name}: the {len(self._runners)} loaded models are pinned "
            f"and at most {self._max_models} may be loaded (OLLAMA_MAX_LOADED_MODELS)"
        )

    # -- runner tasks -------------------------------------------------------------------

    def _start_runner(self, pending: _Pending, placement: Placement) -> Runner:
        request, load = pending.request, pending.load
        configured = self.models.lookup(request.name)
        keep_alive = request.keep_alive
        if keep_alive is None:
            keep_alive = configured.keep_alive
        if keep_alive is None:
            keep_alive = self.settings.keep_alive
        use_mmap = load.use_mmap if load.use_mmap is not None else not placement.on_cpu_only
        spec = LoadSpec(
            model_path=request.model_path,
            name=request.name,
            num_ctx=load.num_ctx,
            num_parallel=load.num_parallel,
            num_batch=load.num_batch,
            num_thread=load.num_thread,
            num_gpu=placement.num_gpu,
            main_gpu=None,
            tensor_split=placement.tensor_split,
            gpu_ids=placement.gpu_ids,
            kv_cache_type=self.settings.kv_cache_type,
            flash_attention=self.settings.flash_attention,
            use_mmap=use_mmap,
            embedding=request.embedding_only,
            context_shift=load.context_shift,
            adapters=request.adapters,
            projector=request.projector,
            chat_template=request.chat_template,
        )
        runner = Runner(
            key=request.key,
            name=request.name,
            digest=request.digest,
            details=request.details,
            load=load,
            spec=spec,
            placement=placement,
            keep_alive=keep_alive,
            adapters=request.adapters,
            projector=request.projector,
            pinned=configured.pinned,
        )
        self._runners[runner.key] = runner
        runner.load_progress = (0, pending.info.file_size)
        self._publish(
            "loading", runner.name, runner.key, completed=0, total=runner.load_progress[1]
        )
        self._nursery.start_soon(self._run_runner, runner, name=f"runner {request.name}")
        return runner

    async def _run_runner(self, runner: Runner) -> None:
        """One runner's whole life.  Errors stay here (I3): they reach the requests that
        wait for this runner, never the scheduler's nursery."""
        vram_baseline: int | None = None  # free VRAM just before the runner exits
        try:
            with runner.scope:
                progress = partial(self._load_progress, runner)
                async with self._engines.open(runner.spec, progress=progress) as engine:
                    runner.loaded_at = trio.current_time()
                    runner.mark_ready(engine)
                    self.calibration.observe(
                        runner.placement, engine.memory.vram_by_gpu, runner.name
                    )
                    seconds = runner.loaded_at - runner.load_started
                    log.info("loaded %s in %.2fs", runner.name, seconds)
                    self._publish("loaded", runner.name, runner.key, seconds=seconds)
                    await runner.serve_until_expired()
                    if not runner.evicting:
                        self._publish("expired", runner.name, runner.key)
                    runner.state = RunnerState.UNLOADING  # no lease may pin it from here on
                    if runner.memory.vram > 0:
                        vram_baseline = await self._gpu_free(runner)
            if runner.scope.cancelled_caught and runner.state is RunnerState.LOADING:
                self._publish("load_failed", runner.name, runner.key, reason="abandoned")
                runner.mark_failed(RunnerStartError("load abandoned: no request wants it"))
        except RunnerError as exc:
            log.warning("runner %s failed: %s", runner.name, exc)
            self._runner_failed(runner, exc)
        except Exception as exc:  # a bug in an engine must not take the scheduler down
            log.exception("runner %s failed unexpectedly", runner.name)
            self._runner_failed(runner, RunnerError(f"runner failed: {exc}"))
        finally:
            runner.mark_failed(runner.error or RunnerError("runner unloaded"))
            if vram_baseline is not None:
                with trio.CancelScope(shield=True):
                    await self._wait_for_vram_recovery(runner, vram_baseline)
            if self._runners.get(runner.key) is runner:
                del self._runners[runner.key]
            self._publish("unloaded", runner.name, runner.key)
            self._wake()

    def _load_progress(self, runner: Runner, completed: int, total: int) -> None:
        """An engine's report: a ``loading`` event whenever the byte count moves."""
        if runner.state is not RunnerState.LOADING or (completed, total) == runner.load_progress:
            return
        runner.load_progress = (completed, total)
        self._publish("loading", runner.name, runner.key, completed=completed, total=total)

    def _runner_failed(self, runner: Runner, error: RunnerError) -> None:
        if runner.state is RunnerState.LOADING:
            reason = "oom" if isinstance(error, OutOfMemoryError) else "error"
            self._publish("load_failed", runner.name, runner.key, reason=reason)
        elif runner.state is RunnerState.READY:
            self._publish("crashed", runner.name, runner.key, reason=str(error))
        runner.mark_failed(error)

    async def _gpu_free(self, runner: Runner) -> int:
        inventory = await self._devices.inventory()
        return sum(g.free for g in inventory.gpus if g.id in runner.memory.vram_by_gpu)

    async def _wait_for_vram_recovery(self, runner: Runner, baseline: int) -> None:
        """B55: drivers report freed VRAM late, so the runner's memory stays booked until
        most of it shows up as free again (bounded; the subtraction is clamped where
        Ollama's unsigned one wraps)."""
        # The driver's free-memory figure is external state with no notification, so this
        # is the one place that polls.
        target = VRAM_RECOVERY_FRACTION * runner.memory.vram
        with trio.move_on_after(VRAM_RECOVERY_TIMEOUT):
            while True:
                if max(0, await self._gpu_free(runner) - baseline) >= target:
                    return
                await trio.sleep(VRAM_RECOVERY_POLL)

    # -- shutdown -----------------------------------------------------------------------

    def _close(self) -> None:
        self._closed = True
        while self._pending:
            self._pending.popleft().fail(SchedulerClosedError("scheduler is shutting down"))


@asynccontextmanager
async def open_scheduler(
    settings: Settings | None = None,
    *,
    engines: EngineFactory | None = None,
    devices: DeviceSource | None = None,
    models: ModelConfig | None = None,
) -> AsyncIterator[Scheduler]:
    """Run a scheduler for the duration of the block; on exit every runner is unloaded.
    ``models`` holds the per-model settings (none by default)."""
    settings = settings or Settings.from_env()
    if devices is None:
        devices = open_device_source(settings)
    if engines is None:
        from ..engines import default_engine_factory

        engines = default_engine_factory(settings, devices)
    async with trio.open_nursery() as nursery:
        sched = Scheduler(settings, engines, devices, nursery, models)
        await sched._freeze_limits()
        await nursery.start(sched._placement_loop)
        try:
            yield sched
        finally:
            sched._close()
            nursery.cancel_scope.cancel()  # runner tasks close their engines, shielded
