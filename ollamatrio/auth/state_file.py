"""The file the keys and their usage live in (``auth.sqlite3`` in the server's state folder).

Each table over it opens a connection per call (worker threads share nothing; WAL lets
readers run beside the one writer) and creates its schema, and the file (mode 0600) with
its folder (0700), on first use.  SQLite is imported there: a server that asks for no key
never loads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Self

if TYPE_CHECKING:
    import sqlite3

FILE_NAME = "auth.sqlite3"


class StateTable:
    """One table of the state file at ``path``; a subclass names its ``SCHEMA``."""

    SCHEMA: ClassVar[str]

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ready = False

    @classmethod
    def in_folder(cls, folder: Path) -> Self:
        return cls(folder / FILE_NAME)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection in one transaction: committed, or rolled back on an error."""
        import sqlite3

        if not self._ready:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with closing(sqlite3.connect(self.path, timeout=30.0)) as db:
            if not self._ready:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(self.SCHEMA)
                self.path.chmod(0o600)  # digests and counts, but nobody else's business
                self._ready = True
            with db:
                yield db
