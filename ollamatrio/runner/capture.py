"""Capture the runner's own fd 2 while llama.cpp loads, still forwarding it to the real stderr.

llama.cpp writes its load errors only to fd 2, and ``Server()`` raises a generic
RuntimeError, so the runner needs the text itself.  fd 2 goes to a regular file in the
private runner directory (not a pipe: an ``abort()`` during the load would lose whatever a
pipe reader had not yet copied; the file survives, and the client reads it after a crash).
A thread copies new bytes to the real stderr as they appear, so the client still sees
progress lines in near real time.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType

from ollamatrio.runner.logs import LineTail

POLL_SECONDS = 0.05  # the file has no readiness notification; this bounds forwarding latency


class CapturedStderr:
    """``with CapturedStderr(path) as cap:`` redirects fd 2 to ``path`` for the block."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tail = LineTail()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._forward, name="stderr-forward", daemon=True)
        self._real = -1
        self._reader = -1

    def __enter__(self) -> CapturedStderr:
        self._real = os.dup(2)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        self._reader = os.open(self.path, os.O_RDONLY)
        os.dup2(fd, 2)
        os.close(fd)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        os.dup2(self._real, 2)
        os.close(self._real)
        os.close(self._reader)
        self.tail.flush()

    def error_text(self) -> str | None:
        return self.tail.error_text()

    def _forward(self) -> None:
        while True:
            stopping = self._stop.wait(POLL_SECONDS)
            while data := os.read(self._reader, 65536):
                os.write(self._real, data)
                self.tail.feed(data)
            if stopping:
                return
