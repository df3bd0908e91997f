"""Make a directory tree read-only, as a read-only mount would, also for tests run as root."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


@contextmanager
def read_only(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """chmod binds an ordinary user; root ignores it, so there every unlink and every new
    temporary file below ``root`` fails with EROFS instead, as on a store remounted
    read-only."""
    for dirpath, _dirs, _files in os.walk(root):
        os.chmod(dirpath, 0o555)
    if os.geteuid() == 0:
        real_unlink, real_mkstemp = os.unlink, tempfile.mkstemp
        prefix = str(root) + os.sep

        def refuse(path: Any) -> None:
            if os.fspath(path).startswith(prefix):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))

        def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
            refuse(path)
            real_unlink(path, *args, **kwargs)

        def mkstemp(*args: Any, dir: Any = None, prefix: str = "tmp", **kwargs: Any) -> Any:
            refuse(os.path.join(os.fspath(dir or "/"), prefix))
            return real_mkstemp(*args, dir=dir, prefix=prefix, **kwargs)

        monkeypatch.setattr(os, "unlink", unlink)
        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    try:
        yield
    finally:
        monkeypatch.undo()
        for dirpath, _dirs, _files in os.walk(root):
            os.chmod(dirpath, 0o755)
