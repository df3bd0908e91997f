"""Reading llama.cpp's stderr: a bounded tail of lines, and the error text worth showing.

llama.cpp logs ``<timestamp> <level> <message>`` lines (level E for errors); aborts print
``<file>:<line>: GGML_ASSERT(...) failed`` without a timestamp.  The root cause of a failed
load is usually the *first* error line (the last one is "exiting due to model loading
error"), so :func:`llama_error_text` picks the informative lines instead of the last one.
"""

from __future__ import annotations

import re
from collections import deque

_LINE = re.compile(r"^\d+(?:\.\d+){3} ([A-Z]) (.*)$")
_SOURCE_PREFIX = re.compile(r"^\S+\.(?:c|cc|cpp|h):\d+: ")
# Lines that only repeat that loading failed, adding nothing to the first error line.
_ECHOES = (
    "failed to load model",
    "exiting due to",
    "llama_model_load_from_file_impl",
    "common_init_",
)


class LineTail:
    """The last ``max_bytes`` of output, split into lines; partial lines are completed later."""

    def __init__(self, max_bytes: int = 8192) -> None:
        self._max_bytes = max_bytes
        self._lines: deque[str] = deque()
        self._size = 0
        self._partial = b""

    def feed(self, data: bytes) -> list[str]:
        """Add output; return the lines it completed."""
        *complete, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > self._max_bytes:  # a runaway line without newline
            complete.append(self._partial)
            self._partial = b""
        lines = [raw.decode("utf-8", "replace").rstrip("\r") for raw in complete]
        for line in lines:
            self._append(line)
        return lines

    def flush(self) -> None:
        """Treat a trailing partial line as complete (the writer has gone)."""
        if self._partial:
            self._append(self._partial.decode("utf-8", "replace"))
            self._partial = b""

    def _append(self, line: str) -> None:
        self._lines.append(line)
        self._size += len(line) + 1
        while self._size > self._max_bytes and len(self._lines) > 1:
            self._size -= len(self._lines.popleft()) + 1

    @property
    def lines(self) -> list[str]:
        return list(self._lines)

    def error_text(self) -> str | None:
        return llama_error_text([*self.lines, self._partial.decode("utf-8", "replace")])


def error_messages(lines: list[str]) -> list[str]:
    """The error-level messages among llama.cpp log lines, without timestamps."""
    found = []
    for line in lines:
        match = _LINE.match(line.strip())
        if match:
            if match.group(1) == "E":
                found.append(" ".join(match.group(2).split()))
        elif "GGML_ASSERT" in line or "GGML_ABORT" in line or "terminate called" in line:
            found.append(_SOURCE_PREFIX.sub("", line.strip()))
    return found


def llama_error_text(lines: list[str]) -> str | None:
    """The most informative error text in ``lines``, or None when llama.cpp reported none."""
    messages = error_messages(lines)
    if not messages:
        return None
    causes = [m for m in messages if not any(echo in m for echo in _ECHOES)]
    aborts = [m for m in messages if "GGML_ASSERT" in m or "GGML_ABORT" in m]
    chosen = aborts[-1:] or causes[:2] or messages[-1:]
    return "; ".join(dict.fromkeys(chosen))
