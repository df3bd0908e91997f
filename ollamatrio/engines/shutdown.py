"""Ending a runner: SIGTERM, a grace period, SIGKILL, and nothing left open.

A runner process lives exactly as long as its engine's ``async with``.  Leaving it cancels
the supervisor, and Trio's ``run_process`` hands the process to :func:`terminate_then_kill`
(SIGTERM and SIGCONT, ``kill_grace`` seconds, then SIGKILL; Trio always reaps).
:func:`close_pipes` closes our ends of its pipes once nothing reads them, and
:func:`collapse` turns the engine nursery's exception group back into the one error a
caller should see.
"""

from __future__ import annotations

import contextlib
import logging
import signal

import trio

from ollamatrio.errors import RunnerCrashedError

log = logging.getLogger(__name__)

KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL


async def terminate_then_kill(process: trio.Process, grace: float) -> None:
    """``run_process``'s ``deliver_cancel``: ask the runner to stop, then make it."""
    process.terminate()
    with contextlib.suppress(OSError):
        process.send_signal(signal.SIGCONT)  # a stopped runner acts on SIGTERM at once
    with trio.move_on_after(grace):
        await process.wait()
    if process.returncode is None:
        log.warning("runner %s ignored SIGTERM; killing it", process.pid)
        process.kill()


async def close_pipes(process: trio.Process | None) -> None:
    """Close our ends of the runner's stdin, stdout and stderr once nothing reads them
    (``run_process`` leaves them to us): without this each runner's three pipes stay
    open until the garbage collector finds its process object."""
    if process is None:
        return
    with trio.CancelScope(shield=True):
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                await stream.aclose()


def collapse(group: BaseExceptionGroup) -> BaseException:
    """The one error inside ``group`` (a crash, a start failure, the body's own error), or
    the group itself when it really holds different errors.  A crash seen both by the
    supervisor and by a request in the body is one event, reported once."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    if len(leaves) == 1 or all(isinstance(e, RunnerCrashedError) for e in leaves):
        return leaves[0]
    return group
