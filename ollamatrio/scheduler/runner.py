"""A resident model as the scheduler sees it: refcount, keep-alive, state.

State changes happen in synchronous stretches (no locks: Trio switches tasks only at
``await``).  Waiters watch a fresh :class:`trio.Event` swapped in on every change.
The runner's lifetime is one task in the scheduler's nursery; this object is its state.

Bn codes in this module name Ollama's behaviours, each defined in docs/behaviours.md.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from ..engines.protocol import Engine
from ..types import LoadSpec, MemoryUsage
from .fair_queue import SlotQueue
from .options import LoadOptions
from .placement import Placement


class RunnerState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    UNLOADING = "unloading"


@dataclass(frozen=True)
class RunnerInfo:
    """A snapshot for /api/ps and metrics."""

    key: str
    name: str
    model_path: str
    digest: str
    details: Mapping[str, Any]
    # loading | ready | unloading.  "unloading" covers a runner on its way out: evicted or
    # asked to unload (it finishes the requests it has first), idle with keep_alive 0, or
    # its process stopping and its memory being freed.
    state: str
    size: int
    size_vram: int
    vram_by_gpu: Mapping[str, int]
    offloaded_fully: bool  # every layer on GPUs
    context_length: int
    num_parallel: int  # slots
    refs: int  # leases held, including those still waiting for a slot
    active: int  # leases being served: holding a slot (at most num_parallel)
    queued: int  # waiting for its load, for a slot, or in the pending list for its model
    keep_alive: float
    expires_at: float | None  # wall-clock seconds; None = never
    pid: int | None
    threads: int = 0  # CPU threads it may use now (scheduler/cores.py; 0: unknown)
    pinned: bool = False  # never evicted, never expires (model_config.py)
    prompt_cache: int = 0  # bytes the host prompt cache holds now, beside ``size``
    prompt_cache_limit: int = 0  # bytes it may grow to (llama.cpp's cache_ram_mib)


class Runner:
    def __init__(
        self,
        *,
        key: str,
        name: str,
        digest: str,
        details: Mapping[str, Any],
        load: LoadOptions,
        spec: LoadSpec,
        placement: Placement,
        keep_alive: float,
        adapters: tuple[str, ...],
        projector: str | None,
        pinned: bool = False,
        fair_share: bool = True,
    ) -> None:
        self.key = key
        self.name = name
        self.digest = digest
        self.details = details
        self.load = load
        self.spec = spec
        self.placement = placement
        self.adapters = adapters
        self.projector = projector
        # A pinned runner never expires and is never an eviction victim; only an explicit
        # unload (or a reload with other options, or shutdown) ends it.
        self.pinned = pinned
        self.keep_alive = math.inf if pinned else keep_alive
        self.state = RunnerState.LOADING
        self.engine: Engine | None = None
        self.error: BaseException | None = None
        self.refs = 0
        self.waiters = 0  # requests waiting for this load to finish
        self.slot_waiters = 0
        self.evicting = False
        self.evicted_at = math.inf
        self.idle_deadline = math.inf
        # The model with its context: predicted until loaded, then what the runner measured.
        self.memory = MemoryUsage(total=placement.total, vram_by_gpu=dict(placement.vram_by_gpu))
        # Host memory its prompt cache holds beside that, as last measured (book_prompt_cache).
        self.prompt_cache_held = 0
        self.context_length = load.num_ctx
        self.loaded = trio.Event()  # set once: ready or failed
        self.stopped = False  # its process has exited (it may still wait for its VRAM)
        self.scope = trio.CancelScope()  # the runner task's whole life
        # Its parallel slots, shared between principals by deficit round-robin (fair_queue.py).
        self.slots = SlotQueue(load.num_parallel, fair=fair_share)
        self.load_started = trio.current_time()
        self.load_progress = (0, 0)  # (completed, total) bytes of model data, while loading
        self.loaded_at = -math.inf
        # When the last lease was released (or the load finished, if none was yet): with
        # keep_alive, what the eviction order ranks idle runners by.
        self.last_used = self.load_started
        self._changed = trio.Event()

    # -- transitions (synchronous) -------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def pin(self, keep_alive: float | None) -> None:
        """A request takes this runner.  Last keep_alive writer wins (B20), except on a
        pinned runner, which ignores the keep_alive of requests."""
        self.refs += 1
        if keep_alive is not None and not self.evicting and not self.pinned:
            self.keep_alive = keep_alive
        self._notify()

    def add_waiter(self) -> None:
        self.waiters += 1
        self._notify()

    def remove_waiter(self) -> None:
        self.waiters -= 1
        self._notify()

    def unpin(self) -> None:
        self.refs -= 1
        assert self.refs >= 0, "lease released twice"
        self.last_used = trio.current_time()
        if self.refs == 0:
            self.idle_deadline = trio.current_time() + self.keep_alive
        self._notify()

    def mark_ready(self, engine: Engine) -> None:
        self.engine = engine
        # The runner measured itself with its prompt cache still empty; what the cache holds
        # is booked apart, as it grows (book_prompt_cache).
        self.memory = engine.memory
        self.context_length = engine.context_length
        self.state = RunnerState.READY
        self.last_used = trio.current_time()
        if self.refs == 0:
            self.idle_deadline = trio.current_time() + self.keep_alive
        self.loaded.set()
        self._notify()

    def book_prompt_cache(self) -> None:
        """Read what its prompt cache holds now (the placement pass books it as host
        memory beside the model)."""
        if self.engine is not None and self.state is RunnerState.READY:
            self.prompt_cache_held = self.engine.prompt_cache_held()

    def mark_failed(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.state = RunnerState.UNLOADING
        self.loaded.set()
        self._notify()

    def mark_stopped(self) -> None:
        self.stopped = True
        self._notify()

    def evict(self) -> None:
        """Unload as soon as the requests using it (or waiting for its load) are done.
        Later requests may still use it (B30), but only for a while: see ``reusable``."""
        if not self.evicting:
            self.evicted_at = trio.current_time()
        self.evicting = True
        self.keep_alive = 0.0
        self.idle_deadline = trio.current_time()
        self._notify()

    @property
    def abandoned(self) -> bool:
        """Its load was given up (nobody waits for it): its task has not ended it yet, but
        it will fail."""
        return self.state is RunnerState.LOADING and self.scope.cancel_called

    def abandon_load_if_unwanted(self) -> None:
        """A client gave up while its model loaded: keep loading only if someone still waits."""
        if self.state is RunnerState.LOADING and self.waiters == 0 and self.refs == 0:
            self.scope.cancel()

    # -- the runner task's idle loop ------------------------------------------------------

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.wait()

    async def serve_until_expired(self) -> None:
        """Return when the runner should unload: idle past its keep-alive, or evicted."""
        # Requests that waited for the load count as users until they have pinned it.
        # The state is read afresh after every change, never remembered across a wait: a
        # lease can come and go (moving idle_deadline) before this task next runs.
        while True:
            idle = self.refs == 0 and self.waiters == 0
            expired = self.keep_alive <= 0 or trio.current_time() >= self.idle_deadline
            if idle and (self.evicting or expired):
                return
            changed = self._changed
            with trio.move_on_at(self.idle_deadline if idle else math.inf):
                await changed.wait()

    # -- introspection ------------------------------------------------------------------

    def stopped_or_taken(self) -> bool:
        """Its process has exited, or a request took it on its way out (B30)."""
        return self.stopped or self.refs > 0

    @property
    def reusable(self) -> bool:
        """Can take new requests.  An evicted runner (B30) takes them for as long as it took
        to load, about what loading it again would cost them; after that it only finishes
        the requests it has, so a busy victim always drains and the request waiting for
        its room is served, however many newcomers would have kept it busy."""
        if self.state is RunnerState.LOADING:
            # Those waiting for the load are served when it is ready, unless it was
            # abandoned: a newcomer waits for a fresh load instead of joining this one.
            return not self.abandoned
        if self.state is not RunnerState.READY:
            return False
        return trio.current_time() < self.evicted_at + (self.loaded_at - self.load_started)

    def expiry(self) -> float:
        """When (Trio time) it would expire if no other request came: its idle deadline
        (last use + keep_alive) when idle; while busy or loading, the earliest it could
        (now + keep_alive); now once it is unloading.  ``inf`` means never."""
        now = trio.current_time()
        if self.state is RunnerState.UNLOADING:
            return now
        idle = self.refs == 0 and self.waiters == 0 and self.state is not RunnerState.LOADING
        return self.idle_deadline if idle else now + self.keep_alive

    def expires_at(self) -> float | None:
        """Wall-clock :meth:`expiry`, so a long request never shows a time in the past
        (Ollama's stale value, B66).  ``None`` means never."""
        now = trio.current_time()
        deadline = self.expiry()
        if math.isinf(deadline):
            return None
        return time.time() + max(0.0, deadline - now)

    def info(self, pending: int = 0) -> RunnerInfo:
        """A snapshot; ``pending`` counts the scheduler's pending requests for this model
        that no runner has taken yet (for example while this one makes way for a reload)."""
        if self.state is RunnerState.LOADING:
            state = "loading"
        elif (
            self.state is RunnerState.UNLOADING
            or self.evicting
            or (self.refs == 0 and self.keep_alive <= 0)
        ):
            state = "unloading"
        else:
            state = "ready"
        return RunnerInfo(
            key=self.key,
            name=self.name,
            model_path=self.spec.model_path,
            digest=self.digest,
            details=self.details,
            state=state,
            size=self.memory.total,
            size_vram=self.memory.vram,
            vram_by_gpu=dict(self.memory.vram_by_gpu),
            offloaded_fully=self.placement.fits_fully and self.placement.num_gpu > 0,
            context_length=self.context_length,
            num_parallel=self.load.num_parallel,
            refs=self.refs,
            # A lease waiting for a slot already holds a reference: count it once, as queued.
            active=self.refs - self.slot_waiters,
            queued=self.waiters + self.slot_waiters + pending,
            keep_alive=self.keep_alive,
            expires_at=self.expires_at(),
            pid=self.engine.pid if self.engine is not None else None,
            threads=self.engine.threads if self.engine is not None else 0,
            pinned=self.pinned,
            prompt_cache=self.prompt_cache_held,
            prompt_cache_limit=self.placement.prompt_cache,
        )
