"""How far a runner process has read its model file, seen from outside (Linux).

The runner cannot tell us itself: xllamacpp's server installs its own model-load progress
callback (so llama.cpp's default one, which logs a dot per percent, never runs, at any
verbosity), does not expose it to Python, and ``xllamacpp.Server()`` holds the GIL for the
whole load, so no Python code in the runner runs until it is over.  But llama.cpp reads the
tensor data through a file descriptor of the model file, and ``/proc/<pid>/fdinfo`` shows
that descriptor's offset: the furthest offset seen is how much of the file has been read.

A GPU load maps the file instead (``use_mmap``) and copies each tensor out of the mapping, so
the offset stays at the header; there the pages of the mapping the process has touched (its
``Rss`` in ``/proc/<pid>/smaps``) grow as the tensors are copied.  The progress is the larger
of the two.

The kernel offers no notification for either, so this polls (as the VRAM recovery wait
does), in a worker thread: a CUDA process's ``smaps`` runs to thousands of mappings.  Where
``/proc`` is missing or the file is never seen open or mapped, nothing is reported.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

POLL_SECONDS = 0.1


class FileOffset:
    """How much of ``path`` process ``pid`` has read: its descriptor's offset, or the
    resident part of its mapping of the file, whichever is larger."""

    def __init__(self, pid: int, path: str) -> None:
        self._pid = pid
        self._path = os.path.realpath(path)
        self._fd: str | None = None  # found once, then read directly

    def read(self) -> int | None:
        offset, mapped = self._offset(), mapped_bytes(self._pid, self._path)
        if offset is None and mapped is None:
            return None
        return max(offset or 0, mapped or 0)

    def _offset(self) -> int | None:
        try:
            if self._fd is None:
                self._fd = self._find()
            if self._fd is None:
                return None
            with open(f"/proc/{self._pid}/fdinfo/{self._fd}") as f:
                for line in f:
                    if line.startswith("pos:"):
                        return int(line.split()[1])
        except (OSError, ValueError):
            self._fd = None  # closed (or reused): look again next time
        return None

    def _find(self) -> str | None:
        folder = f"/proc/{self._pid}/fd"
        for fd in os.listdir(folder):
            try:
                if os.readlink(f"{folder}/{fd}") == self._path:
                    return fd
            except OSError:
                continue
        return None


async def watch_file_reads(
    pid: int, path: str, total: int, report: Callable[[int, int], None]
) -> None:
    """Report ``(furthest offset, total)`` whenever it grows, until cancelled."""
    offset = FileOffset(pid, path)
    furthest = 0
    while True:
        seen = await trio.to_thread.run_sync(offset.read)
        if seen is not None and seen > furthest:
            furthest = min(seen, total)
            report(furthest, total)
        await trio.sleep(POLL_SECONDS)


def mapped_bytes(pid: int, path: str) -> int | None:
    """The resident bytes of every mapping of ``path`` (a real path) in process ``pid``;
    None if it has none (or ``/proc`` cannot tell)."""
    total: int | None = None
    inside = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    # A mapping's header: "start-end perms offset dev inode   path".
                    inside = line.rstrip("\n").endswith(" " + path)
                elif inside and line.startswith("Rss:"):
                    total = (total or 0) + int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return total
