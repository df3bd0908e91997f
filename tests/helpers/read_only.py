"""Make a directory tree read-only, as a read-only mount would, also for tests run as root."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


@contextmanager
def read_only(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """chmod binds an ordinary user; root ignores it, so there every unlink below ``root``
    fails with EROFS instead, as it does on a store remounted read-only."""
    for dirpath, _dirs, _files in os.walk(root):
        os.chmod(dirpath, 0o555)
    if os.geteuid() == 0:
        real_unlink = os.unlink
        prefix = str(root) + os.sep

        def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
            if os.fspath(path).startswith(prefix):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
            real_unlink(path, *args, **kwargs)

        monkeypatch.setattr(os, "unlink", unlink)
    try:
        yield
    finally:
        monkeypatch.undo()
        for dirpath, _dirs, _files in os.walk(root):
            os.chmod(dirpath, 0o755)
