"""A process-wide cache of GGUF headers.

Model files in the store are content-addressed blobs that never change under a path, so
one header read per path is enough; the scheduler then plans from memory with no I/O on
its hot path.  Reads of uncached files go to a worker thread.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import trio

from .errors import GGUFError
from .gguf import GGUFInfo, read_gguf

_MAX_ENTRIES = 512
_cache: OrderedDict[str, GGUFInfo] = OrderedDict()


def cached(path: str) -> GGUFInfo | None:
    return _cache.get(path)


def _remember(path: str, info: GGUFInfo) -> GGUFInfo:
    _cache[path] = info
    _cache.move_to_end(path)
    while len(_cache) > _MAX_ENTRIES:
        _cache.popitem(last=False)
    return info


def read_cached(path: str) -> GGUFInfo:
    """Synchronous variant (worker threads, scripts, test setup)."""
    info = _cache.get(path)
    return info if info is not None else _remember(path, read_gguf(path))


async def read_model_info(path: str) -> GGUFInfo:
    info = _cache.get(path)
    if info is None:
        info = _remember(path, await trio.to_thread.run_sync(_read_and_check, path))
    return info


def _read_and_check(path: str) -> GGUFInfo:
    """The header, with the vocabulary checked in the same worker thread (a file read, so
    never on the event loop; then remembered with the header)."""
    info = read_gguf(path)
    with contextlib.suppress(GGUFError):  # the header read is what reports a bad file
        _ = info.duplicate_token
    return info
