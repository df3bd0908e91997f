"""Spawning a runner: its private folder, its environment and its process.

Each runner gets a folder of its own (mode 0700, locked by us and by the runner; its
socket and load log live there), removed when the engine closes.  The environment is
ours, with the package importable, no gdb attach on abort, and only the GPUs the
scheduler booked visible.  The process runs under Trio's ``run_process`` in the engine's
supervisor; cancelling it ends the runner as ``shutdown.py`` says.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import trio

from ollamatrio.engines.shutdown import terminate_then_kill
from ollamatrio.runner.folders import make_runner_folder
from ollamatrio.runner.visibility import visible_devices_env
from ollamatrio.types import LoadSpec

RUNNER_MODULE = "ollamatrio.runner"


def runner_argv(python: str) -> list[str]:
    return [python, "-m", RUNNER_MODULE]


def runner_env(inherited: Mapping[str, str], spec: LoadSpec) -> dict[str, str]:
    """The runner's environment: ``inherited``, the package on ``PYTHONPATH``, and the
    GPUs of ``spec`` alone visible."""
    env = dict(inherited)
    env["GGML_NO_BACKTRACE"] = "1"  # no gdb attach on abort()
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding ollamatrio/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    # Only the GPUs the scheduler booked, and none for a CPU load (it would otherwise
    # still create a CUDA context on every GPU).
    env.update(visible_devices_env(spec))
    return env


@contextmanager
def runner_folder(made: tuple[str, int] | None = None) -> Iterator[tuple[str, int]]:
    """A runner's folder and the descriptor of our lock on it, for the ``with`` block:
    ``made`` (a spare runner's, made when it started) or a new one."""
    # Mode 0700, locked by us and the runner.
    socket_dir, owner_fd = made if made is not None else make_runner_folder()
    try:
        yield socket_dir, owner_fd
    finally:
        remove_runner_folder(socket_dir, owner_fd)


def remove_runner_folder(socket_dir: str, owner_fd: int) -> None:
    shutil.rmtree(socket_dir, ignore_errors=True)
    os.close(owner_fd)


async def run_runner_process(
    argv: list[str],
    *,
    env: dict[str, str],
    owner_fd: int | None,
    kill_grace: float,
    exited: trio.Event,
    task_status: trio.TaskStatus[trio.Process],
) -> None:
    """Run the runner until it exits or the task is cancelled; ``exited`` is set either way.
    The folder's lock descriptor is inherited, so the folder stays locked while it lives."""
    try:
        await trio.run_process(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            pass_fds=() if owner_fd is None else (owner_fd,),
            check=False,
            deliver_cancel=partial(terminate_then_kill, grace=kill_grace),
            task_status=task_status,
        )
    finally:
        exited.set()
