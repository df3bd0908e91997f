"""Spinners and progress bars on stderr, drawn like Ollama's ``progress`` package.

On a terminal the lines are redrawn in place by a small drawing thread (this is plain
synchronous code, not Trio).  Anywhere else each line is written once, when it is final,
so logs and pipes get a readable record instead of escape codes.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from typing import TextIO

from .humanize import go_duration, human_bytes

SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_FRAME_SECONDS = 0.1
_BAR_WIDTH = 24


class Spinner:
    """A status line with an animated spinner until it stops."""

    def __init__(self, message: str, clock: Callable[[], float]) -> None:
        self.message = message
        self.started = clock()
        self.stopped = False
        self._clock = clock

    def stop(self) -> None:
        self.stopped = True

    @property
    def done(self) -> bool:
        return self.stopped

    def render(self, width: int) -> str:
        if self.stopped:
            return f"{self.message} " if self.message else ""
        frame = SPINNER_FRAMES[int((self._clock() - self.started) / _FRAME_SECONDS) % 10]
        return f"{self.message} {frame}" if self.message else frame


class Bar:
    """A byte-count progress bar: ``pulling 6a0746a1ec1a:  45% ▕███     ▏ 44 MB/98 MB``."""

    def __init__(
        self, message: str, total: int, completed: int, clock: Callable[[], float]
    ) -> None:
        self.message = message
        self.total = max(total, 0)
        self.completed = completed
        self._clock = clock
        self._start = (clock(), completed)
        self.stopped = False

    def set(self, completed: int, total: int | None = None) -> None:
        if total:
            self.total = total
        self.completed = completed

    def stop(self) -> None:
        self.stopped = True

    @property
    def done(self) -> bool:
        return self.stopped or (self.total > 0 and self.completed >= self.total)

    def percent(self) -> int:
        if self.total <= 0:
            return 0
        return min(100, int(self.completed * 100 / self.total))

    def render(self, width: int, *, plain: bool = False) -> str:
        pct = self.percent()
        head = f"{self.message}: {pct:3d}%"
        if self.done and self.completed >= self.total:
            tail = human_bytes(self.total)
        else:
            tail = f"{human_bytes(self.completed)}/{human_bytes(self.total)}"
            elapsed = self._clock() - self._start[0]
            moved = self.completed - self._start[1]
            if elapsed > 0.5 and moved > 0:
                rate = moved / elapsed
                eta = int((self.total - self.completed) / rate)
                tail += f"  {human_bytes(int(rate))}/s  {go_duration(eta * 1_000_000_000)}"
        if plain:
            return f"{head} {tail}"
        bar_width = max(10, min(_BAR_WIDTH, width - len(head) - len(tail) - 4))
        filled = bar_width * pct // 100
        bar = "█" * filled + " " * (bar_width - filled)
        return f"{head} ▕{bar}▏ {tail}"


State = Spinner | Bar


class Progress:
    """An ordered set of status lines (spinners and bars) written to ``stream``."""

    def __init__(
        self,
        stream: TextIO,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self._clock = clock
        self._states: list[State] = []
        self._printed: set[int] = set()  # ids of states already written (plain mode)
        self._drawn_lines = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False
        if self.tty:
            self.stream.write("\x1b[?25l")  # hide the cursor while drawing
            self._thread = threading.Thread(target=self._animate, daemon=True)
            self._thread.start()

    # --- adding states ---

    def spinner(self, message: str) -> Spinner:
        """Stop the current spinner, if any, and start a new line with ``message``."""
        spinner = Spinner(message, self._clock)
        self._add(spinner)
        return spinner

    def bar(self, message: str, total: int, completed: int = 0) -> Bar:
        bar = Bar(message, total, completed, self._clock)
        self._add(bar)
        return bar

    def _add(self, state: State) -> None:
        with self._lock:
            for old in self._states:
                if isinstance(old, Spinner):
                    old.stop()
            self._states.append(state)
        self.refresh()

    def set_message(self, spinner: Spinner, message: str) -> None:
        with self._lock:
            spinner.message = message
        self.refresh()

    def update(self, bar: Bar, completed: int, total: int | None = None) -> None:
        """Move ``bar`` and redraw, under the lock: the drawing thread (and a thread
        feeding events) never renders a half-updated bar."""
        with self._lock:
            bar.set(completed, total)
        self.refresh()

    # --- drawing ---

    def refresh(self) -> None:
        """Draw now (terminal) or write the lines that became final (plain)."""
        with self._lock:
            if self.tty:
                self._draw()
            else:
                self._write_final(force=False)

    def _animate(self) -> None:
        while not self._stop.wait(_FRAME_SECONDS):
            with self._lock:
                self._draw()

    def _draw(self) -> None:
        width = shutil.get_terminal_size((80, 24)).columns
        lines = [state.render(width) for state in self._states]
        lines = [line[: width - 1] for line in lines if line]
        out = []
        if self._drawn_lines > 1:  # back to the first line drawn last time
            out.append(f"\x1b[{self._drawn_lines - 1}A")
        out.append("\r")
        out.append("\n".join(f"{line}\x1b[K" for line in lines))
        if len(lines) < self._drawn_lines:
            out.append("\x1b[J")
        self.stream.write("".join(out))
        self.stream.flush()
        self._drawn_lines = len(lines)

    def _write_final(self, *, force: bool) -> None:
        for state in self._states:
            if id(state) in self._printed or not (force or state.done):
                continue
            line = state.render(0, plain=True) if isinstance(state, Bar) else state.render(0)
            self._printed.add(id(state))
            if line.strip():
                self.stream.write(line.rstrip() + "\n")
        self.stream.flush()

    def stop(self, *, clear: bool = False) -> None:
        """Finish: leave the final lines on screen, or erase them with ``clear``.
        Only the first call draws anything."""
        if self._stopped:
            return
        self._stopped = True
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        with self._lock:
            for state in self._states:
                if isinstance(state, Spinner):
                    state.stop()
            if self.tty:
                if clear:
                    if self._drawn_lines > 1:
                        self.stream.write(f"\x1b[{self._drawn_lines - 1}A")
                    self.stream.write("\r\x1b[J")
                else:
                    self._draw()
                    if self._drawn_lines:
                        self.stream.write("\n")
                self.stream.write("\x1b[?25h")
                self._drawn_lines = 0
                self.stream.flush()
            elif not clear:
                self._write_final(force=True)
            self._states.clear()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def short_status(status: str) -> str:
    """``pulling sha256:<64 hex>`` → ``pulling <first 12 hex>``, as Ollama labels layers."""
    verb, sep, digest = status.partition(" ")
    if sep and digest.startswith("sha256:") and len(digest) > 19:
        return f"{verb} {digest[7:19]}"
    return status


class StatusRenderer:
    """Turns ``/api/pull``-style progress events into spinners and bars.

    An event with a ``digest`` and a ``total`` is a byte transfer and gets a bar keyed by
    digest; any other new ``status`` replaces the running spinner (Ollama's behaviour)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self._bars: dict[str, Bar] = {}
        self._status: str | None = None
        self._spinner: Spinner | None = None

    def feed(self, event: dict[str, object]) -> None:
        status = str(event.get("status") or "")
        digest = str(event.get("digest") or "")
        total = _int(event.get("total"))
        completed = _int(event.get("completed"))
        if digest and total:
            bar = self._bars.get(digest)
            if bar is None:
                if self._spinner is not None:
                    self._spinner.stop()
                    self._spinner = None
                label = short_status(status) if status else f"pulling {digest[7:19]}"
                bar = self._bars[digest] = self.progress.bar(label, total, completed)
                self._status = status
            bar.set(completed, total)
            self.progress.refresh()
        elif status and status != self._status:
            self._status = status
            self._spinner = self.progress.spinner(status)


def show_load(progress: Progress, bar: Bar | None, label: str, load: object) -> Bar | None:
    """A ``load_progress`` line of a stream waiting for its model, or a ``loading`` event:
    one bar for the load (created on the first, moved by the next ones)."""
    if not isinstance(load, dict):
        return bar
    completed, total = _int(load.get("completed")), _int(load.get("total"))
    if bar is None:
        return progress.bar(label, total, completed)
    progress.update(bar, completed, total)
    return bar


def _int(value: object) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0
