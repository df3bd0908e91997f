"""The ready handshake: the runner's configuration in, its ready line out.

The engine writes a :class:`~ollamatrio.runner.options.RunnerConfig` as one JSON line on
the runner's stdin (the API key never touches argv) and waits for one event line on its
stdout (``runner/events.py``): a :class:`~ollamatrio.runner.events.RunnerReady` with the
socket, the context length and the measured memory, or a failure (an out-of-memory one
marked as such).  The wait has no fixed limit but
a stall timeout, ``load_timeout`` seconds without progress, that every stderr line of the
loading runner extends (:class:`LoadStall`).  Meanwhile :func:`watch_load` reports how much
of the model file the runner has read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import trio

from ollamatrio.engines.load_watch import watch_file_reads
from ollamatrio.engines.protocol import LoadProgress
from ollamatrio.errors import OutOfMemoryError, RunnerStartError
from ollamatrio.runner.events import SPARE_LINE, MalformedEventError, RunnerReady, read_event
from ollamatrio.runner.logs import LineTail
from ollamatrio.runner.options import RunnerConfig, is_oom


async def send_config(stdin: trio.abc.SendStream, config: RunnerConfig) -> None:
    try:
        await stdin.send_all(config.to_json().encode() + b"\n")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # it died at once; the ready wait reports why


class LoadStall:
    """The load's deadline: ``timeout`` seconds without progress, while the wait runs."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._scope: trio.CancelScope | None = None

    @contextmanager
    def running(self) -> Iterator[trio.CancelScope]:
        """The deadline's scope around the wait; :meth:`progress` extends it meanwhile."""
        with trio.move_on_after(self.timeout) as scope:
            self._scope = scope
            try:
                yield scope
            finally:
                self._scope = None

    def progress(self) -> None:
        """The runner wrote something: give it ``timeout`` seconds more."""
        if self._scope is not None:
            self._scope.relative_deadline = self.timeout


async def wait_ready(
    stdout: trio.abc.ReceiveStream,
    *,
    name: str,
    stall: LoadStall,
    tail: LineTail,
    died: Callable[[], Awaitable[str]],
) -> RunnerReady:
    """The runner's ready line; :class:`RunnerStartError` (or :class:`OutOfMemoryError`)
    when it reports an error, stalls, or dies first (``died`` says how)."""
    buffer = b""
    with stall.running() as scope:
        while True:
            while b"\n" not in buffer:
                data = await stdout.receive_some(65536)
                if not data:
                    break
                buffer += data
            # A spare runner taken before it said it was ready says so now: not our answer.
            if buffer.startswith(SPARE_LINE):
                buffer = buffer[len(SPARE_LINE) :]
                continue
            break
    if scope.cancelled_caught:
        last = tail.error_text()
        raise RunnerStartError(
            "timed out waiting for llama runner to start"
            + (f" - {last}" if last else f": no progress for {stall.timeout:g}s")
        )
    line = buffer.split(b"\n", 1)[0].strip()
    if not line:  # stdout closed: the runner died while loading
        raise RunnerStartError(await died())
    try:
        event = read_event(line)
    except MalformedEventError as exc:
        raise RunnerStartError(str(exc)) from None
    if isinstance(event, RunnerReady):
        return event
    cls = OutOfMemoryError if event.oom or is_oom(event.error) else RunnerStartError
    raise cls(f"llama runner failed to load model {name!r}: {event.error}")


async def watch_load(
    pid: int, model_path: str, total: int, progress: LoadProgress, scope: trio.CancelScope
) -> None:
    """Report how much of the model file the runner has read, until ``scope`` is
    cancelled (the ready wait is over)."""
    with scope:
        await watch_file_reads(pid, model_path, total, progress)
