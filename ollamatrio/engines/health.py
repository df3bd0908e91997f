"""Health and stall watch: noticing that a runner died or went quiet, and saying why.

:class:`RunnerWatch` holds what an engine knows of its runner process's health: whether it
has exited, the tail of its stderr (drained by a task of the supervisor, so the pipe never
fills), and whether we killed it ourselves.  From these it builds the errors a request
sees: a crash report with the exit status or signal and llama.cpp's last error line
(:meth:`RunnerWatch.crash_message`), the reason a connection to the runner failed
(:meth:`RunnerWatch.lost`), and, for a generation that got no byte for its stall timeout,
the runner killed and reported as crashed (:meth:`RunnerWatch.kill_stalled`) so the
scheduler drops it and starts a new one for the next request.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable

import trio

from ollamatrio.errors import RunnerCrashedError, RunnerError
from ollamatrio.runner.logs import LineTail, llama_error_text

log = logging.getLogger(__name__)

EXIT_REPORT_WAIT = 1.0  # how long a failed request waits to learn that the runner died
STDERR_SETTLE = 0.3  # how long to wait for the last stderr bytes of a dead runner
STDERR_TAIL_BYTES = 8192


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def load_log_error(socket_dir: str) -> str | None:
    """llama.cpp's error text from the runner's load log (survives an abort during load)."""
    try:
        with open(os.path.join(socket_dir, "load.log"), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - STDERR_TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return llama_error_text(text.splitlines())


class RunnerWatch:
    """One runner process's health, as its engine sees it."""

    def __init__(self, *, name: str, socket_dir: str) -> None:
        self._name = name  # the model, for log lines
        self._socket_dir = socket_dir  # where the load log is
        self.process: trio.Process | None = None  # set once spawned
        self.tail = LineTail(STDERR_TAIL_BYTES)
        self.exited = trio.Event()
        self.stderr_closed = trio.Event()
        self.killed_for: str | None = None  # why we killed a runner that still served

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.process is not None else None

    async def drain_stderr(
        self, stream: trio.abc.ReceiveStream, on_output: Callable[[], None]
    ) -> None:
        """Keep the tail of the runner's stderr; ``on_output`` after every read (a load
        that writes is making progress)."""
        try:
            async for data in stream:
                for line in self.tail.feed(bytes(data)):
                    log.debug("runner: %s", line, extra={"model": self._name})
                on_output()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.tail.flush()
            self.stderr_closed.set()

    async def crash_message(self, *, during_load: bool = False) -> str:
        """Why the runner ended: its exit status or signal and its last error line."""
        with trio.move_on_after(EXIT_REPORT_WAIT):
            await self.exited.wait()
        with trio.move_on_after(STDERR_SETTLE):
            await self.stderr_closed.wait()
        reason = self.tail.error_text()
        if reason is None and during_load:
            reason = await trio.to_thread.run_sync(load_log_error, self._socket_dir)
        what = "llama runner process has terminated"
        exit_text = describe_exit(self.returncode)
        return f"{what}: {exit_text}" + (f": {reason}" if reason else "")

    async def lost(self, *, closing: bool) -> RunnerError | None:
        """The error for a request whose connection to the runner failed, if the runner's
        end explains it (we killed it, or it exited while not asked to); else ``None``."""
        with trio.move_on_after(EXIT_REPORT_WAIT):
            await self.exited.wait()
        if self.killed_for is not None:
            return RunnerCrashedError(self.killed_for, self.returncode)
        if self.exited.is_set() and not closing:
            return RunnerCrashedError(
                "model runner has unexpectedly stopped: " + await self.crash_message(),
                self.returncode,
            )
        return None

    async def kill_stalled(self, message: str) -> RunnerCrashedError:
        """Kill the silent runner (SIGKILL: a frozen or wedged process ignores SIGTERM); its
        supervisor reports the exit as a crash, so the scheduler drops it and the next
        request starts a new one."""
        if self.killed_for is None and not self.exited.is_set():
            self.killed_for = message + "; the runner was killed"
            assert self.process is not None
            log.warning(
                "%s (pid %s)", self.killed_for, self.process.pid, extra={"model": self._name}
            )
            with contextlib.suppress(OSError):
                self.process.kill()
        with trio.move_on_after(EXIT_REPORT_WAIT):
            await self.exited.wait()
        return RunnerCrashedError(self.killed_for or message, self.returncode)
