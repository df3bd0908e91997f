"""A spare runner: one runner process started ahead of need, waiting for its model.

A cold load spends a few tenths of a second before llama.cpp even opens the model: the
runner's interpreter, its imports and the engine's (xllamacpp).  :class:`SpareKeeper` keeps
one process that has done all of that (``python -m ollamatrio.runner --spare FOLDER``) and now
blocks reading its configuration; :meth:`SpareKeeper.take` hands it to the next load whose
environment it was started with (the same visible GPUs: a CPU load), which only sends the
configuration.  Once the spare has served (its load failed, its first request ended, or
its engine closed: never during the load or the first prompt, so that the next spare's
imports do not take the CPU from them) the keeper starts the next one.

At most one spare exists.  It is an ordinary process of the machine, so the host memory the
scheduler places models with (``psutil``'s available memory) already counts it; it holds no
model and no GPU context until it is taken.  The keeper owns the spare until it is taken and
the engine that takes it from then on (:func:`adopt_runner_process`); a spare that dies
while waiting ends the keeping (logged once): a broken engine is reported by the next load
the ordinary way.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from ollamatrio.engines.shutdown import close_pipes, terminate_then_kill
from ollamatrio.engines.spawn import remove_runner_folder
from ollamatrio.runner.events import SPARE_FLAG, SPARE_LINE
from ollamatrio.runner.folders import make_runner_folder

log = logging.getLogger(__name__)

SPARE_KILL_GRACE = 2.0  # seconds: a spare holds no model, SIGTERM ends it at once


@dataclass
class Spare:
    """A waiting runner process, its environment and its private folder."""

    process: trio.Process
    env: dict[str, str]
    socket_dir: str
    owner_fd: int
    ready: bool = False  # it said its imports are done


class SpareKeeper:
    """Keeps at most one :class:`Spare` while :meth:`run` runs."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self._argv = [*argv, SPARE_FLAG]
        self._env = env  # what the next spare is started with
        self._spare: Spare | None = None
        self._taken = trio.Event()
        self._load_over = trio.Event()
        self._waiting = trio.Event()  # set while a spare waits

    @property
    def spare(self) -> Spare | None:
        return self._spare

    async def wait_spare(self) -> Spare:
        """The spare, once one waits with its imports done (benchmarks and tests)."""
        while self._spare is None or not self._spare.ready:
            await self._waiting.wait()
        return self._spare

    def take(self, env: dict[str, str]) -> Spare | None:
        """The waiting spare if it was started with ``env`` (then the caller owns it and
        calls :meth:`load_over` once it has served), else None."""
        spare = self._spare
        if spare is None or spare.env != env or spare.process.returncode is not None:
            return None
        self._spare = None
        self._waiting = trio.Event()
        self._load_over = trio.Event()
        self._taken.set()
        return spare

    def load_over(self) -> None:
        """The spare taken last has served: the keeper may start the next one."""
        self._load_over.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a spare until cancelled; the one still waiting then is ended."""
        task_status.started()
        while True:
            spare = await self._start()
            self._spare = spare
            self._taken = trio.Event()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_when, spare.process.wait, nursery.cancel_scope)
                    nursery.start_soon(self._read_ready_line, spare)
                    await self._taken.wait()
                    nursery.cancel_scope.cancel()
            finally:
                if self._spare is spare:  # not taken: cancelled, or it died
                    self._spare = None
                    self._waiting = trio.Event()
                    with trio.CancelScope(shield=True):
                        await _end(spare)
            if not self._taken.is_set():
                log.warning(
                    "the spare runner exited while waiting (%s); cold loads start their own",
                    spare.process.returncode,
                )
                return
            await self._load_over.wait()

    async def _read_ready_line(self, spare: Spare) -> None:
        """Wait for the spare's ready line.  It is one write shorter than a pipe's atomic
        size, so it arrives whole; if the spare is taken first, the engine skips it."""
        assert spare.process.stdout is not None
        line = await spare.process.stdout.receive_some(len(SPARE_LINE))
        if line != SPARE_LINE:
            return  # it exited (b""), or wrote an error: the watcher ends the keeping
        spare.ready = True
        log.debug("spare runner %d ready", spare.process.pid)
        self._waiting.set()

    async def _start(self) -> Spare:
        socket_dir, owner_fd = make_runner_folder()
        try:
            # The spare knows its folder from the start: it removes it however it leaves,
            # also on stdin EOF when the server was killed before it was taken.
            process = await trio.lowlevel.open_process(
                [*self._argv, socket_dir],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env,
                pass_fds=(owner_fd,),
            )
        except BaseException:
            remove_runner_folder(socket_dir, owner_fd)
            raise
        log.debug("spare runner %d started", process.pid)
        return Spare(process, self._env, socket_dir, owner_fd)


async def _cancel_when(wait: Callable[[], Awaitable[object]], scope: trio.CancelScope) -> None:
    await wait()
    scope.cancel()


async def _end(spare: Spare) -> None:
    """End a spare nobody took: its stdin closed (it exits on EOF), SIGTERM, SIGKILL."""
    if spare.process.returncode is None:
        await terminate_then_kill(spare.process, SPARE_KILL_GRACE)
        await spare.process.wait()
    await close_pipes(spare.process)
    remove_runner_folder(spare.socket_dir, spare.owner_fd)


async def adopt_runner_process(
    process: trio.Process,
    *,
    kill_grace: float,
    exited: trio.Event,
    task_status: trio.TaskStatus[trio.Process],
) -> None:
    """:func:`~ollamatrio.engines.spawn.run_runner_process` for a process already running
    (a taken spare): supervise it until it exits or the task is cancelled, then end it as
    ``run_process`` would; ``exited`` is set either way."""
    task_status.started(process)
    try:
        await process.wait()
    finally:
        if process.returncode is None:
            with trio.CancelScope(shield=True):
                await terminate_then_kill(process, kill_grace)
                await process.wait()
        exited.set()
