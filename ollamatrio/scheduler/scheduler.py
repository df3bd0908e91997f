"""The scheduler: admission, leases, and the placement task that applies the policy.

Shape (docs/scheduling.md):

* ``async with open_scheduler(settings) as sched`` owns a nursery: one task per runner
  (its whole life: load, serve, expire, unload; ``runner_task.py``) and one placement task.
* ``async with sched.lease(request) as lease`` hands out a runner.  The refcount rises
  with no checkpoint after it and falls synchronously when the block exits, also by
  cancellation, so a client that disconnects never leaks a lease.
* A request for a loaded model takes the fast path: no queue, no placement task.
  Everything else joins the pending list; the placement task walks it in arrival order
  whenever something changes, asks ``policy.py`` what each request gets and carries that
  out.  A request that can be served now (it fits in free memory) never waits behind one
  that needs an eviction; requests that need evictions are served in arrival order, and
  the memory they wait for is reserved for them.
* Requests waiting for a parallel slot of a runner are served round-robin between
  principals, weighted by each request's cost (``fair_queue.py``); requests waiting for a
  load (the pending list) are placed in arrival order.
* Every waiting request, including one waiting for a parallel slot of a loaded model,
  counts against ``OLLAMA_MAX_QUEUE``.

This module owns the scheduler's state (the runners, the pending list, the queue count)
and its public API; the records it trades in are in ``admission.py``.

Bn codes in this module name Ollama's behaviours, each defined in docs/behaviours.md.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from .. import model_info
from ..config import Settings
from ..devices import DeviceSource, Inventory, device_source, usable_cores
from ..devices.cpu_load import CpuElsewhere
from ..engines.protocol import EngineFactory
from ..errors import (
    GGUFError,
    ModelNotFoundError,
    OutOfMemoryError,
    QueueFullError,
    RunnerStartError,
    SchedulerClosedError,
)
from ..gguf import GGUFInfo
from ..gguf.speculation import has_mtp_heads
from ..kv_cache import requested_kv_types
from ..memory import gpu_context_reserve, projector_bytes
from ..model_config import ModelConfig
from .admission import Lease, ModelRequest, PendingRequest
from .calibration import VramCalibration
from .core_share import CoreShare
from .events import EventHub, EventKind, EvictReason, SchedulerEvent
from .options import LoadOptions, default_context_length, resolve_load_options
from .placement import Placement
from .policy import Fail, Load, compatible, decide, free_room, retry_after_oom
from .prompt_cache import grants
from .runner import Runner, RunnerInfo, RunnerState
from .runner_task import RunnerTasks

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(
        self,
        settings: Settings,
        engines: EngineFactory,
        devices: DeviceSource,
        nursery: trio.Nursery,
        models: ModelConfig | None = None,
        *,
        cpu_elsewhere: CpuElsewhere | None = None,
    ) -> None:
        self.settings = settings
        self.models = models or ModelConfig()  # per-model settings (OLLAMATRIO_CONFIG)
        self._engines = engines
        self._devices = devices
        self._runners: dict[str, Runner] = {}
        self._pending: deque[PendingRequest] = deque()
        self._waiting = 0  # requests waiting anywhere: queue, load, slot
        self._wakeup = trio.Event()  # the placement task's
        self._changed = trio.Event()  # anyone else's (a fresh one on every change)
        self._closed = False
        # Frozen from the first inventory in open_scheduler (B11, B15).
        self._max_models = settings.max_loaded_models
        self._default_ctx = default_context_length(settings.context_length, 0)
        self.calibration = VramCalibration()
        # Wall-clock seconds of recent placement passes (benchmarks, metrics).
        self.pass_seconds: deque[float] = deque(maxlen=4096)
        self.events = EventHub()
        # The cores divided among the runners that generate (core_share.py).
        self.core_share = CoreShare(
            settings.cores or usable_cores(), self.runners, elsewhere=cpu_elsewhere
        )
        self._tasks = RunnerTasks(
            settings=settings,
            models=self.models,
            engines=engines,
            devices=devices,
            nursery=nursery,
            runners=self._runners,
            events=self.events,
            calibration=self.calibration,
            wake=self._wake,
            cores=self.core_share.cores,
        )

    # -- public API ---------------------------------------------------------------------

    @asynccontextmanager
    async def lease(self, request: ModelRequest) -> AsyncIterator[Lease]:
        started = trio.current_time()
        runner = await self._acquire(request)  # returns with refs already +1
        self.core_share.changed()
        try:
            load_duration = max(0.0, runner.loaded_at - started)
            if not runner.slots.try_take():  # fast path: no checkpoint
                await self._wait_for_slot(runner, request)
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
            self.core_share.changed()

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

    async def stop(self, model_path: str) -> bool:
        """:meth:`unload`, then wait until each runner of the model that had no request has
        stopped (its process exited), so that ``/api/ps`` no longer lists it when the
        caller answers.  A busy runner is not waited for: it finishes its requests first,
        listed as unloading meanwhile (as Ollama answers at once and lists it)."""
        idle = [
            r for r in self._runners.values()
            if r.spec.model_path == model_path and r.refs == 0 and r.waiters == 0
        ]  # fmt: skip
        unloaded = self.unload(model_path)
        for runner in idle:
            await runner.wait_until(runner.stopped_or_taken)
        return unloaded

    def unload_all(self) -> None:
        for runner in list(self._runners.values()):
            self.unload(runner.spec.model_path)

    def ps(self) -> list[RunnerInfo]:
        """Every runner, latest expiry first (B65): loading, ready and unloading until its
        process has exited (as Ollama, which takes a model off its list before waiting for
        its VRAM to come back; the placement pass counts it until then).  A runner's
        ``queued`` includes the pending requests for its model file that it has not taken
        yet."""
        pending: dict[str, int] = {}
        for p in self._pending:
            pending[p.request.key] = pending.get(p.request.key, 0) + 1
        for runner in self._runners.values():
            runner.book_prompt_cache()  # what each cache holds now
        infos = [r.info(pending.get(key, 0)) for key, r in self._runners.items() if not r.stopped]
        return sorted(
            infos, key=lambda i: math.inf if i.expires_at is None else i.expires_at, reverse=True
        )

    async def free_memory(self) -> list[tuple[str, int]]:
        """Bytes a new load could use now without evicting anything, per GPU (its id) and
        for the host's RAM (``"host"``, last), as the placement pass counts them: runners
        being evicted already gone, unloading ones still there.  For a fleet's gateway
        (``/api/ps``), which places cold models on hosts that have room."""
        inventory = await self._devices.inventory()
        runners = list(self._runners.values())
        going = {r for r in runners if r.evicting and r.state is not RunnerState.UNLOADING}
        rooms, host = free_room(runners, inventory, going, (), self.calibration)
        return [(room.id, room.free) for room in rooms] + [("host", host)]

    async def device_totals(self) -> list[tuple[str, str, int, int]]:
        """Each GPU's ``(id, name, total, reserve)``, then the host RAM's (``"host"``, last):
        ``reserve`` is what placement keeps back on a GPU (``OLLAMA_GPU_OVERHEAD`` and a
        runner's context), nothing on the host.  For the console's device bars."""
        inventory = await self._devices.inventory()
        overhead = self.settings.gpu_overhead
        return [
            (gpu.id, gpu.name, gpu.total, overhead + gpu_context_reserve(gpu.library))
            for gpu in inventory.gpus
        ] + [("host", "host RAM", inventory.system.total, 0)]

    def runners(self) -> list[Runner]:
        """Every runner the scheduler holds (loading, ready, unloading); for metrics."""
        return list(self._runners.values())

    def runner(self, model_path: str) -> Runner | None:
        """The runner (loading, ready or unloading) for a model file, if any."""
        return self._runners.get(model_path)

    def load_needed(self, request: ModelRequest) -> bool:
        """Whether a lease for ``request`` would wait for a load, as far as can be told now
        (the lease's fast path, without taking it)."""
        runner = self._runners.get(request.key)
        if runner is None or runner.state is not RunnerState.READY:
            return True
        info = model_info.cached(request.model_path)
        return info is None or not compatible(runner, request, self._load_options(request, info))

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
        if (
            runner is not None
            and runner.state is RunnerState.READY
            and compatible(runner, request, load)
        ):
            runner.pin(request.keep_alive)  # fast path (B3): no checkpoint after this
            return runner

        projector = 0
        if request.projector is not None:
            projector = projector_bytes(await self._read_model(request.projector))
        pending = PendingRequest(request, info, load, projector)
        if request.draft is not None and load.draft_num_predict > 0:
            pending.draft_info = await self._read_model(request.draft)
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
                if not retry_after_oom(pending, runner.error, self._runners.values()):
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

    def _publish(self, kind: EventKind, model: str, key: str, **fields: Any) -> None:
        self.events.publish(SchedulerEvent(kind, model, key, **fields))

    def _evict(self, runner: Runner, reason: EvictReason) -> None:
        if not runner.evicting and runner.state is not RunnerState.UNLOADING:
            self._publish("evicting", runner.name, runner.key, reason=reason)
        runner.evict()

    def _admit(self) -> None:
        if self._waiting >= self.settings.max_queue:
            raise QueueFullError()
        self._waiting += 1

    async def _wait_for_slot(self, runner: Runner, request: ModelRequest) -> None:
        self._admit()
        runner.slot_waiters += 1
        try:
            await runner.slots.take(request.principal, request.priority, request.cost)
        finally:
            runner.slot_waiters -= 1
            self._waiting -= 1

    def _forget(self, pending: PendingRequest) -> None:
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
            embeddings=request.embeddings,
            architecture=info.architecture,
            has_projector=request.projector is not None,
            shift=request.shift,
            has_draft_model=request.draft is not None or has_mtp_heads(info),
            configured_draft_num_predict=configured.draft_num_predict,
            kv_cache_types=requested_kv_types(
                [configured.kv_cache_types], self.settings.kv_cache_type
            ),
            speculative_default=configured.speculative,
        )

    def _expire_idle_runners(self) -> None:
        for runner in self._runners.values():
            if not runner.pinned:
                self._evict(runner, "oom")

    # -- the placement task -------------------------------------------------------------

    def _wake(self) -> None:
        self.core_share.changed()
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
            # Woken for a request, or a runner that became ready or went away: either way
            # the room left for prompt caches changed.
            if not self._pending and not self._has_prompt_caches():
                continue
            inventory = await self._devices.inventory()
            for runner in self._runners.values():
                runner.book_prompt_cache()
            reserved: list[Placement] = []
            if self._pending:
                reserved = self._place_pending(inventory)
            self._grant_prompt_caches(inventory, reserved)

    def _has_prompt_caches(self) -> bool:
        return any(r.placement.prompt_cache > 0 for r in self._runners.values())

    def _grant_prompt_caches(self, inventory: Inventory, reserved: list[Placement]) -> None:
        """Share the host memory nobody booked (the loads this pass started and the room
        promised to requests waiting for evictions count as booked) among the ready
        runners' prompt caches: they give way to the models before any is evicted."""
        caching = [
            r
            for r in self._runners.values()
            if r.state is RunnerState.READY and r.engine is not None and r.placement.prompt_cache
        ]
        if not caching:
            return
        _, spare = free_room(self._runners.values(), inventory, set(), reserved, self.calibration)
        limits = [(r.placement.prompt_cache, r.prompt_cache_held) for r in caching]
        for runner, nbytes in zip(caching, grants(limits, spare), strict=True):
            assert runner.engine is not None
            runner.engine.grant_prompt_cache(nbytes)

    def _place_pending(self, inventory: Inventory) -> list[Placement]:
        """One synchronous pass over the waiting requests, in arrival order; returns the
        room promised to those that wait for evictions."""
        started = time.perf_counter()
        try:
            return self._place_pending_pass(inventory)
        finally:
            self.pass_seconds.append(time.perf_counter() - started)

    def _place_pending_pass(self, inventory: Inventory) -> list[Placement]:
        reserved: list[Placement] = []  # promised to the request that waits for evictions
        eviction_in_progress = False
        waiting_keys: set[str] = set()  # decided "wait" in this pass: same answer for the rest
        remaining: deque[PendingRequest] = deque()
        for pending in self._pending:
            request = pending.request
            runner = self._runners.get(request.key)
            if runner is not None:
                if compatible(runner, request, pending.load) and not pending.evict_others:
                    pending.attach(runner)
                    continue
                remaining.append(pending)
                if runner.state is RunnerState.UNLOADING or runner.evicting or runner.abandoned:
                    continue  # the old one is on its way out; decide when it is gone
                # Loaded with other options: it must go first (B25), in arrival order.
                if not eviction_in_progress:
                    eviction_in_progress = True
                    self._evict(runner, "reload")
                continue
            if request.key in waiting_keys and not pending.evict_others:
                remaining.append(pending)
                continue

            decision = decide(
                pending,
                self._runners.values(),
                inventory,
                reserved,
                settings=self.settings,
                models=self.models,
                max_models=self._max_models,
                calibration=self.calibration,
            )
            if isinstance(decision, Fail):
                pending.fail(decision.error)
            elif isinstance(decision, Load):
                runner = self._tasks.start(pending, decision.placement)
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
        return reserved

    # -- shutdown -----------------------------------------------------------------------

    def _close(self) -> None:
        self._closed = True
        while self._pending:
            self._pending.popleft().fail(SchedulerClosedError("scheduler is shutting down"))


def default_cpu_elsewhere(settings: Settings) -> CpuElsewhere | None:
    """The reader of the cores other processes keep busy, for the runner processes the
    settings' engine starts (simulated runners use no cores to share)."""
    return CpuElsewhere(settings.cores or usable_cores()) if settings.engine == "process" else None


@asynccontextmanager
async def open_scheduler(
    settings: Settings | None = None,
    *,
    engines: EngineFactory | None = None,
    devices: DeviceSource | None = None,
    models: ModelConfig | None = None,
    cpu_elsewhere: CpuElsewhere | None = None,
) -> AsyncIterator[Scheduler]:
    """Run a scheduler for the duration of the block; on exit every runner is unloaded.
    ``models`` holds the per-model settings (none by default).  ``cpu_elsewhere`` reads the
    cores other processes keep busy; by default it is read for runner processes started from
    ``settings`` (not for an engine factory given here, nor for simulated engines)."""
    settings = settings or Settings.from_env()
    if devices is None:
        devices = device_source(settings)
    if engines is None:
        from ..engines import default_engine_factory

        engines = default_engine_factory(settings, devices)
        if cpu_elsewhere is None:
            cpu_elsewhere = default_cpu_elsewhere(settings)
    async with trio.open_nursery() as nursery:
        sched = Scheduler(settings, engines, devices, nursery, models, cpu_elsewhere=cpu_elsewhere)
        await sched._freeze_limits()
        await nursery.start(sched._placement_loop)
        await nursery.start(sched.core_share.run)
        try:
            yield sched
        finally:
            sched._close()
            nursery.cancel_scope.cancel()  # runner tasks close their engines, shielded
