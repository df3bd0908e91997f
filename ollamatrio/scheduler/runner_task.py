"""The runner task: one runner's whole life in the scheduler's nursery.

:meth:`RunnerTasks.start` turns a placement decision into a :class:`~.runner.Runner` (its
``LoadSpec``, keep-alive and pinning), books it in the scheduler's registry and starts its
task.  :meth:`RunnerTasks.run` is that task: open the engine, mark the runner ready, serve
until it expires or is evicted, close the engine, wait for its VRAM to come back, and take
it off the books.  Errors stay in the task: they reach the requests waiting for the
runner, never the scheduler's nursery.  Every lifecycle event (loading, loaded, expired,
load_failed, crashed, unloaded) is published here, in the stretch that changes the state.

The registry is the scheduler's own dict, shared rather than copied (one Trio thread, no
locks); ``wake`` tells the placement task that room or a slot in the count was freed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Literal

import trio

from ..config import Settings
from ..devices import DeviceSource
from ..engines.protocol import Engine, EngineFactory
from ..errors import OutOfMemoryError, RunnerError, RunnerStartError
from ..model_config import ModelConfig
from ..types import LoadSpec
from .admission import PendingRequest
from .calibration import VramCalibration
from .events import EventHub, SchedulerEvent
from .placement import Placement
from .prompt_cache import MiB
from .runner import Runner, RunnerState
from .vram_recovery import gpu_free, wait_for_vram_recovery

log = logging.getLogger(__name__)


def load_phases(engine: Engine, seconds: float) -> dict[str, float]:
    """Seconds per phase of a load that took ``seconds``: ``admission`` (from the runner's
    booking to the engine's start), then the engine's own (``engine.load_phases``, which a
    process engine reports; none from an engine that does not measure them)."""
    reported = engine.load_phases
    if not reported:
        return {}
    admission = round(max(0.0, seconds - sum(reported.values())), 4)
    return {"admission": admission, **reported}


def describe(phases: Mapping[str, float]) -> str:
    """`` (admission 0.001s, spawn 0.012s, ...)`` for the log line, or nothing."""
    if not phases:
        return ""
    return " (" + ", ".join(f"{name} {value:.3f}s" for name, value in phases.items()) + ")"


class RunnerTasks:
    """Starts runners in the scheduler's nursery and runs each one's life."""

    def __init__(
        self,
        *,
        settings: Settings,
        models: ModelConfig,
        engines: EngineFactory,
        devices: DeviceSource,
        nursery: trio.Nursery,
        runners: dict[str, Runner],
        events: EventHub,
        calibration: VramCalibration,
        wake: Callable[[], None],
        cores: int = 0,
    ) -> None:
        self._settings = settings
        self._models = models
        self._engines = engines
        self._devices = devices
        self._nursery = nursery
        self._runners = runners
        self._events = events
        self._calibration = calibration
        self._wake = wake
        self._cores = cores  # each runner's thread pool, unless num_thread fixes its count

    def start(self, pending: PendingRequest, placement: Placement) -> Runner:
        """A new runner for ``pending`` at ``placement``, booked and loading."""
        request, load = pending.request, pending.load
        settings = self._settings
        configured = self._models.lookup(request.name)
        keep_alive = request.keep_alive
        if keep_alive is None:
            keep_alive = configured.keep_alive
        if keep_alive is None:
            keep_alive = settings.keep_alive
        use_mmap = load.use_mmap if load.use_mmap is not None else not placement.on_cpu_only
        spec = LoadSpec(
            model_path=request.model_path,
            name=request.name,
            num_ctx=load.num_ctx,
            num_parallel=load.num_parallel,
            num_batch=load.num_batch,
            num_thread=load.num_thread,
            cores=0 if load.num_thread else self._cores,
            num_gpu=placement.num_gpu,
            main_gpu=None,
            tensor_split=placement.tensor_split,
            gpu_ids=placement.gpu_ids,
            kv_cache_type_k=load.kv_cache_types.k,
            kv_cache_type_v=load.kv_cache_types.v,
            flash_attention=settings.flash_attention,
            use_mmap=use_mmap,
            embedding=load.embeddings,
            context_shift=load.context_shift,
            adapters=request.adapters,
            projector=request.projector,
            chat_template=request.chat_template,
            prompt_cache_mib=placement.prompt_cache // MiB,
            draft_model=request.draft if load.draft_num_predict > 0 else None,
            draft_gpu_layers=-1 if placement.draft_on_gpu else 0,
            mtp=load.draft_num_predict > 0 and request.draft is None,
            draft_num_predict=load.draft_num_predict,
            speculative=load.drafter,
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
            fair_share=settings.fair_share,
        )
        self._runners[runner.key] = runner
        runner.load_progress = (0, pending.info.file_size)
        self._events.publish(
            SchedulerEvent(
                "loading", runner.name, runner.key, completed=0, total=runner.load_progress[1]
            )
        )
        self._nursery.start_soon(self.run, runner, name=f"runner {request.name}")
        return runner

    async def run(self, runner: Runner) -> None:
        """One runner's whole life.  Errors stay here: they reach the requests that
        wait for this runner, never the scheduler's nursery."""
        vram_baseline: int | None = None  # free VRAM just before the runner exits
        try:
            with runner.scope:
                progress = partial(self._load_progress, runner)
                async with self._engines.open(runner.spec, progress=progress) as engine:
                    runner.loaded_at = trio.current_time()
                    runner.mark_ready(engine)
                    self._calibration.observe(
                        runner.placement, engine.memory.vram_by_gpu, runner.name
                    )
                    seconds = runner.loaded_at - runner.load_started
                    phases = load_phases(engine, seconds)
                    log.info("loaded %s in %.2fs%s", runner.name, seconds, describe(phases))
                    self._publish("loaded", runner, seconds=seconds, phases=phases or None)
                    self._wake()  # its prompt cache gets its grant
                    await runner.serve_until_expired()
                    if not runner.evicting:
                        self._publish("expired", runner)
                    runner.state = RunnerState.UNLOADING  # no lease may pin it from here on
                    if runner.memory.vram > 0:
                        vram_baseline = await gpu_free(self._devices, runner)
            if runner.scope.cancelled_caught and runner.state is RunnerState.LOADING:
                self._publish("load_failed", runner, reason="abandoned")
                runner.mark_failed(RunnerStartError("load abandoned: no request wants it"))
        except RunnerError as exc:
            log.warning("runner %s failed: %s", runner.name, exc)
            self._failed(runner, exc)
        except Exception as exc:  # a bug in an engine must not take the scheduler down
            log.exception("runner %s failed unexpectedly", runner.name)
            self._failed(runner, RunnerError(f"runner failed: {exc}"))
        finally:
            runner.mark_failed(runner.error or RunnerError("runner unloaded"))
            runner.mark_stopped()
            if vram_baseline is not None:
                with trio.CancelScope(shield=True):
                    await wait_for_vram_recovery(self._devices, runner, vram_baseline)
            if self._runners.get(runner.key) is runner:
                del self._runners[runner.key]
            self._publish("unloaded", runner)
            self._wake()

    def _publish(
        self,
        kind: Literal["loaded", "expired", "load_failed", "crashed", "unloaded"],
        runner: Runner,
        *,
        reason: str | None = None,
        seconds: float | None = None,
        phases: Mapping[str, float] | None = None,
    ) -> None:
        self._events.publish(
            SchedulerEvent(
                kind, runner.name, runner.key, reason=reason, seconds=seconds, phases=phases
            )
        )

    def _load_progress(self, runner: Runner, completed: int, total: int) -> None:
        """An engine's report: a ``loading`` event whenever the byte count moves."""
        if runner.state is not RunnerState.LOADING or (completed, total) == runner.load_progress:
            return
        runner.load_progress = (completed, total)
        self._events.publish(
            SchedulerEvent("loading", runner.name, runner.key, completed=completed, total=total)
        )

    def _failed(self, runner: Runner, error: RunnerError) -> None:
        if runner.state is RunnerState.LOADING:
            reason = "oom" if isinstance(error, OutOfMemoryError) else "error"
            self._publish("load_failed", runner, reason=reason)
        elif runner.state is RunnerState.READY:
            self._publish("crashed", runner, reason=str(error))
        runner.mark_failed(error)
