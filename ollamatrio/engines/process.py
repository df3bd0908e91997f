"""Engines backed by a runner subprocess (Ollama's ``LlamaServer``).

``ProcessEngineFactory.open(spec)`` starts ``python -m ollamatrio.runner`` inside its own
nursery and supervises it; :class:`ProcessEngine` is the model it hosts.  This module puts
the pieces together, each in a module of its own:

* ``spawn.py``: the runner's folder, environment and process;
* ``handshake.py``: the configuration on stdin (the API key never touches argv) and the
  ready line, under a stall timeout that every stderr line extends;
* ``health.py``: the stderr tail, crash reports, and the runner killed when a generation
  stalls;
* ``shutdown.py``: SIGTERM, grace, SIGKILL, reaping, the pipes closed;
* ``runner_client.py``: llama.cpp's HTTP API over the runner's Unix socket with a
  :class:`~ollamatrio.engines.runner_http.RunnerHttp` (raw Trio streams, pooled
  connections), which :class:`ProcessEngine` extends;
* ``slot_persist.py``: with an on-disk prompt cache, the slots saved as the engine closes
  (before SIGTERM, under a shielded deadline) and restored for the prompts they begin.

Lifetimes: the process lives exactly as long as the ``async with``.  Leaving it sends
SIGTERM (and SIGCONT, so a stopped runner acts on it), waits ``kill_grace`` seconds, then
SIGKILLs, and always reaps.  If the runner dies on its own, calls in flight raise
:class:`RunnerCrashedError` (with the signal name and the last error line) and the body of
the ``async with`` is cancelled, so the same error comes out of it.  A generation that gets
no byte from the runner for ``stall_timeout`` seconds (llama.cpp reports prompt progress, so
only a frozen or wedged runner is that quiet) kills the runner: the request fails with that
reason and the scheduler, seeing a crash, starts a new runner for the next request.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from ollamatrio.config import DEFAULT_STALL_TIMEOUT
from ollamatrio.engines.cache_allowance import MiB, PromptCacheAllowance, open_allowance
from ollamatrio.engines.chunk_stream import ChunkStream
from ollamatrio.engines.handshake import LoadStall, send_config, wait_ready, watch_load
from ollamatrio.engines.health import RunnerWatch
from ollamatrio.engines.protocol import LoadProgress
from ollamatrio.engines.runner_client import RunnerClient, open_runner_http
from ollamatrio.engines.shutdown import KILL_GRACE, close_pipes, collapse
from ollamatrio.engines.slot_persist import SlotPersistence
from ollamatrio.engines.spare import Spare, SpareKeeper, adopt_runner_process
from ollamatrio.engines.spawn import run_runner_process, runner_argv, runner_env, runner_folder
from ollamatrio.errors import OllamatrioError, RunnerCrashedError, RunnerError
from ollamatrio.runner.events import RunnerMemory, RunnerReady
from ollamatrio.runner.options import RunnerConfig
from ollamatrio.slot_cache import SAVE_SECONDS, SlotCache, cache_key
from ollamatrio.types import CompletionRequest, Embeddings, LoadSpec, MemoryUsage, Ranking

if TYPE_CHECKING:
    from ollamatrio.config import Settings

log = logging.getLogger(__name__)

DEFAULT_LOAD_TIMEOUT = 300.0  # Ollama: 5 minutes without progress

# A load's stretches in order, each named by the mark that ends it: ours ("spawned",
# "handshake") and the runner's (its ready line's "marks"), all on time.monotonic, which is
# CLOCK_MONOTONIC on Linux and so the same clock in both processes.
LOAD_PHASES = ("spawn", "interpreter", "engine_import", "plan", "model_load", "ready", "handshake")
_ENDS = {"spawn": "spawned", "interpreter": "main"}


def load_phases(marks: Mapping[str, float]) -> dict[str, float]:
    """Seconds per phase of :data:`LOAD_PHASES` from the marks that end them (``opened``
    starts the first); a phase whose mark is missing is left out, the next one spanning it,
    and one whose mark came before the previous one's (a spare runner imported the engine
    before the load) is 0."""
    phases: dict[str, float] = {}
    last = marks.get("opened")
    for phase in LOAD_PHASES:
        end = marks.get(_ENDS.get(phase, phase))
        if last is not None and end is not None:
            phases[phase] = round(max(0.0, end - last), 4)
        # A spare runner's first marks come before the load: those phases are 0.
        last = max(last, end) if last is not None and end is not None else (end or last)
    return phases


class ProcessEngineFactory:
    """Opens :class:`ProcessEngine` instances: one runner subprocess per loaded model."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        load_timeout: float | None = None,
        stall_timeout: float | None = None,
        kill_grace: float = KILL_GRACE,
        verbosity: int | None = None,
        slot_cache: SlotCache | None = None,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        spare_runner: bool | None = None,
    ) -> None:
        """``settings`` supplies ``load_timeout`` (OLLAMA_LOAD_TIMEOUT), ``stall_timeout``
        (OLLAMATRIO_STALL_TIMEOUT), the log level (OLLAMA_DEBUG), the on-disk prompt cache
        (OLLAMATRIO_PROMPT_DISK_CACHE) and whether a spare runner is kept
        (OLLAMATRIO_SPARE_RUNNER; without settings, none); keyword arguments override them.
        The spare is kept while :meth:`keep_spare` runs."""
        if slot_cache is None and settings is not None and settings.prompt_disk_cache > 0:
            slot_cache = SlotCache(settings.prompt_disk_cache_dir, settings.prompt_disk_cache)
        if load_timeout is None:
            load_timeout = settings.load_timeout if settings is not None else DEFAULT_LOAD_TIMEOUT
        if stall_timeout is None:
            stall_timeout = (
                settings.stall_timeout if settings is not None else DEFAULT_STALL_TIMEOUT
            )
        if verbosity is None:
            verbosity = 3 if settings is not None and settings.debug > 0 else 1
        self.load_timeout = math.inf if load_timeout <= 0 else load_timeout
        self.stall_timeout = math.inf if stall_timeout <= 0 else stall_timeout
        self.kill_grace = kill_grace
        self.verbosity = verbosity
        self.slot_cache = slot_cache
        self.python = python
        self.env = dict(os.environ if env is None else env)
        if spare_runner is None:
            spare_runner = settings is not None and settings.spare_runner
        # The spare starts with a CPU load's environment (every GPU hidden): a load on GPUs
        # (their own visible devices) starts a runner of its own, as before.
        self.spares = (
            SpareKeeper(runner_argv(python), self.runner_env(LoadSpec(model_path="", name="")))
            if spare_runner
            else None
        )

    def runner_env(self, spec: LoadSpec) -> dict[str, str]:
        """The environment a runner for ``spec`` starts with."""
        return runner_env(self.env, spec)

    async def keep_spare(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep a spare runner for the next cold load until cancelled (if this factory
        keeps one at all)."""
        if self.spares is None:
            task_status.started()
            return
        await self.spares.run(task_status=task_status)

    @asynccontextmanager
    async def open(
        self, spec: LoadSpec, *, progress: LoadProgress | None = None
    ) -> AsyncIterator[ProcessEngine]:
        slot_save_dir = ""
        if self.slot_cache is not None and not spec.embedding:
            slot_save_dir = str(await trio.to_thread.run_sync(self.slot_cache.ensure_folder))
        opened = time.monotonic()
        spare = self.spares.take(self.runner_env(spec)) if self.spares is not None else None
        made = (spare.socket_dir, spare.owner_fd) if spare is not None else None
        with runner_folder(made) as (socket_dir, owner_fd):
            config = RunnerConfig(
                spec=spec,
                api_key=secrets.token_urlsafe(32),
                socket_dir=socket_dir,
                parent_pid=os.getpid(),
                verbosity=self.verbosity,
                slot_save_dir=slot_save_dir,
            )
            engine = ProcessEngine(config, self, owner_fd=owner_fd, progress=progress)
            engine._marks["opened"] = opened
            engine._spare = spare
            try:
                async with trio.open_nursery() as nursery:
                    try:
                        await nursery.start(engine._supervise)
                    except BaseException:
                        engine._spare_used()
                        raise
                    try:
                        yield engine
                    finally:
                        engine._spare_used()
                        engine._closing = True
                        await engine._save_slots()
                        engine._lifetime.cancel()  # -> SIGTERM, grace, SIGKILL, reap
                        nursery.cancel_scope.cancel()
            except BaseExceptionGroup as group:
                raise collapse(group) from None


class ProcessEngine(RunnerClient):
    """A model loaded in a runner subprocess; valid inside its factory's ``open`` block."""

    def __init__(
        self,
        config: RunnerConfig,
        factory: ProcessEngineFactory,
        *,
        owner_fd: int | None = None,
        progress: LoadProgress | None = None,
    ) -> None:
        super().__init__(
            name=config.spec.name,
            context_length=config.spec.num_ctx,
            num_parallel=config.spec.num_parallel,
            stall_timeout=factory.stall_timeout,
        )
        self._config = config
        self._factory = factory
        self._spec = config.spec
        self._owner_fd = owner_fd  # the folder's owner lock, inherited by the runner
        self._watch = RunnerWatch(name=config.spec.name, socket_dir=config.socket_dir)
        self._load_stall = LoadStall(factory.load_timeout)
        self._closing = False
        # The runner process's scope: shielded once it is ready, cancelled by ``open``.
        self._lifetime = trio.CancelScope()
        self._progress = progress
        self._persistence: SlotPersistence | None = None  # with a prompt cache, once ready
        self.ready: RunnerReady | None = None  # the runner's ready line, once ready
        self._threads = 0  # the CPU threads last told (0: none yet, the ready line's count)
        self._marks: dict[str, float] = {}  # time.monotonic() at each end of a load phase
        self._spare: Spare | None = None  # the spare runner this engine took, if any
        self._cache: PromptCacheAllowance | None = None  # with a host prompt cache, once ready

    # -- Engine protocol: facts --------------------------------------------------------

    @property
    def spec(self) -> LoadSpec:
        return self._spec

    @property
    def pid(self) -> int | None:
        process = self._watch.process
        return process.pid if process is not None else None

    @property
    def returncode(self) -> int | None:
        return self._watch.returncode

    @property
    def memory(self) -> MemoryUsage:
        measured = self.ready.memory if self.ready is not None else RunnerMemory()
        vram = dict(measured.vram_by_gpu)
        host = measured.rss or measured.uss
        return MemoryUsage(total=host + sum(vram.values()), vram_by_gpu=vram)

    def prompt_cache_held(self) -> int:
        return self._cache.held() if self._cache is not None else 0

    def grant_prompt_cache(self, nbytes: int) -> None:
        if self._cache is not None:
            self._cache.grant(nbytes)

    @property
    def thread_pool(self) -> int:
        ready = self.ready
        return ready.threads if ready is not None and ready.thread_control else 0

    @property
    def threads(self) -> int:
        return self._threads or (self.ready.threads if self.ready is not None else 0)

    async def use_threads(self, threads: int) -> None:
        """Tell the runner on its stdin (runner/threads.py).  Only the scheduler's core
        share sends these, one at a time, so lines never interleave."""
        pool = self.thread_pool
        process = self._watch.process
        if not pool or process is None or process.stdin is None:
            return
        threads = max(1, min(threads, pool))
        try:
            await process.stdin.send_all(b'{"threads":%d}\n' % threads)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            return  # the runner is gone or going: its supervisor reports that
        self._threads = threads

    @property
    def load_phases(self) -> dict[str, float]:
        """Seconds per phase of this runner's start (:data:`LOAD_PHASES`), once ready."""
        return load_phases(self._marks)

    @property
    def stderr_lines(self) -> list[str]:
        return self._watch.tail.lines

    # -- lifetime ----------------------------------------------------------------------

    async def _supervise(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Run the runner: spawn (or adopt the spare), wait until ready, then watch for an
        unrequested exit."""
        try:
            with self._lifetime:
                await self._supervise_process(
                    runner_argv(self._factory.python), task_status=task_status
                )
        finally:
            await close_pipes(self._watch.process)

    async def _supervise_process(
        self, argv: list[str], *, task_status: trio.TaskStatus[None]
    ) -> None:
        watch = self._watch
        async with trio.open_nursery() as nursery:
            if self._spare is not None:
                start = partial(
                    adopt_runner_process,
                    self._spare.process,
                    kill_grace=self._factory.kill_grace,
                    exited=watch.exited,
                )
            else:
                start = partial(
                    run_runner_process,
                    argv,
                    env=self._factory.runner_env(self._spec),
                    owner_fd=self._owner_fd,
                    kill_grace=self._factory.kill_grace,
                    exited=watch.exited,
                )
            process: trio.Process = await nursery.start(start)
            self._marks["spawned"] = time.monotonic()
            watch.process = process
            assert process.stdin is not None
            assert process.stdout is not None
            assert process.stderr is not None
            nursery.start_soon(watch.drain_stderr, process.stderr, self._load_stall.progress)
            await send_config(process.stdin, self._config)
            watching = trio.CancelScope()
            if self._progress is not None:
                total = (await trio.Path(self._spec.model_path).stat()).st_size
                self._progress(0, total)
                nursery.start_soon(
                    watch_load, process.pid, self._spec.model_path, total, self._progress, watching
                )
            try:
                ready = self.ready = await wait_ready(
                    process.stdout,
                    name=self._spec.name,
                    stall=self._load_stall,
                    tail=watch.tail,
                    died=partial(watch.crash_message, during_load=True),
                )
            finally:
                watching.cancel()
            if self._progress is not None:
                self._progress(total, total)
            self._context_length = ready.context_length or self._spec.num_ctx
            if self._spec.prompt_cache_mib > 0:  # measured now, while the cache is empty
                self._cache = open_allowance(process.pid, self._spec.prompt_cache_mib * MiB)
            cache = self._factory.slot_cache
            plan = dataclasses.asdict(ready.plan) if ready.plan is not None else {}
            if cache is not None and self._config.slot_save_dir and not plan.get("embedding"):
                key = cache_key(self._spec, plan, self._context_length)
                self._persistence = SlotPersistence(
                    self, cache, key=key, model_path=self._spec.model_path
                )
            async with open_runner_http(ready.socket, self._config.api_key) as http:
                self._http = http
                self._marks.update(ready.marks)
                self._marks["handshake"] = time.monotonic()
                if self._persistence is not None:  # read before any request can wait on it
                    await self._persistence.load()
                # Ready: from now on only the engine's owner stops the runner (``_stop``), so
                # that a cancelled owner can still save its slots before the SIGTERM.
                self._lifetime.shield = True
                task_status.started()
                await watch.exited.wait()
                if not self._closing:
                    message = watch.killed_for or await watch.crash_message()
                    raise RunnerCrashedError(message, self.returncode)

    # -- the on-disk prompt cache ---------------------------------------------------------

    async def _before_send(
        self, request: CompletionRequest, path: str, body: dict[str, Any]
    ) -> None:
        if self._persistence is not None:
            await self._persistence.before_send(request, path, body)

    async def _save_slots(self) -> None:
        """Save the slots worth keeping before the runner is stopped: shielded (an
        eviction or shutdown cancels the engine's scope) and bounded by ``SAVE_SECONDS``.
        A runner that died, or never became ready, has nothing to save."""
        persistence = self._persistence
        if persistence is None or self._watch.exited.is_set() or self._http is None:
            return
        started = trio.current_time()
        with trio.CancelScope(shield=True, deadline=started + SAVE_SECONDS) as scope:
            try:
                kept = await persistence.save_all()
            except (OllamatrioError, OSError) as exc:
                log.warning("prompt cache: saving %s's slots failed: %s", self._spec.name, exc)
                return
        if scope.cancelled_caught:
            log.warning(
                "prompt cache: saving %s's slots ran past %.1fs; the rest is not kept",
                self._spec.name,
                SAVE_SECONDS,
            )
        elif kept:
            log.info(
                "prompt cache: kept %d slot states of %s in %.2fs",
                kept,
                self._spec.name,
                trio.current_time() - started,
            )

    # -- the spare it took -------------------------------------------------------------

    def _spare_used(self) -> None:
        """The spare this engine took has served: its load failed, its first request ended
        or the engine closed.  Only then does the next spare start, so that its imports do
        not take the CPU from this load or from its first prompt."""
        if self._spare is not None and self._factory.spares is not None:
            self._factory.spares.load_over()
        self._spare = None

    @asynccontextmanager
    async def complete(self, request: CompletionRequest) -> AsyncIterator[ChunkStream]:
        try:
            async with super().complete(request) as chunks:
                yield chunks
        finally:
            self._spare_used()

    async def embed(
        self, inputs: Sequence[str], *, truncate: bool = True, dimensions: int | None = None
    ) -> Embeddings:
        try:
            return await super().embed(inputs, truncate=truncate, dimensions=dimensions)
        finally:
            self._spare_used()

    async def rerank(self, query: str, documents: Sequence[str]) -> Ranking:
        try:
            return await super().rerank(query, documents)
        finally:
            self._spare_used()

    # -- health ------------------------------------------------------------------------

    async def runner_gone(self, exc: BaseException | None) -> RunnerError:
        error = await self._watch.lost(closing=self._closing)
        return error if error is not None else await super().runner_gone(exc)

    async def stalled(self) -> RunnerError:
        """Kill the silent runner; its supervisor reports the exit as a crash, so the
        scheduler drops it and the next request starts a new one."""
        return await self._watch.kill_stalled(self._stall_message())

    async def healthy(self) -> bool:
        return not self._watch.exited.is_set() and await super().healthy()
