"""The on-disk prompt cache: slot states saved by unloading runners, and their index.

Files live in one private folder (0700, each file 0600) beside the model store; an
embedded SQLite database (``index.sqlite3``) says, for each file, the cache key it belongs
to (model and KV-shaping options, :mod:`.key`), the model file it was computed with, its
tokens, its size and when it was last used.  A state is found only under its own key, so
no model or option set ever sees another's.

The folder holds at most ``limit`` bytes of states: adding one evicts the least recently
used until the rest fits, and a state that alone exceeds the bound is not kept.  A state
whose tokens are a prefix of a newer one of the same key is dropped (the newer one serves
every prompt the older one did); a new state that is a prefix of a kept one is not added.

Runners write a state under a temporary name (``tmp-….bin``, llama.cpp's
``slot_save_path``), and :meth:`SlotCache.commit` reads its tokens, renames it to its
content name and indexes it, so a save cut short (a runner killed mid-write) leaves a
stray temporary file that :meth:`SlotCache.sweep` removes, never a half-indexed entry.

Every method blocks (sqlite3, file I/O); callers run them off the Trio thread.  Each call
opens its own connection, so runners saving at once share nothing but the database file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import time
from array import array
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .statefile import read_state_tokens

if TYPE_CHECKING:
    import sqlite3

log = logging.getLogger(__name__)

INDEX_NAME = "index.sqlite3"
TEMP_PREFIX = "tmp-"
SUFFIX = ".bin"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS states (
    name TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    model_path TEXT NOT NULL,
    n_tokens INTEGER NOT NULL,
    tokens BLOB NOT NULL,
    size INTEGER NOT NULL,
    used REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS states_key ON states (key);
CREATE INDEX IF NOT EXISTS states_used ON states (used);
"""


@dataclass(frozen=True)
class Match:
    """A saved state for a prompt: its file name, how many of the prompt's leading tokens
    it holds (``shared``), and its own length."""

    name: str
    shared: int
    n_tokens: int


def _pack(tokens: list[int]) -> bytes:
    return array("i", tokens).tobytes()


def _unpack(blob: bytes) -> list[int]:
    values = array("i")
    values.frombytes(blob)
    return values.tolist()


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


class SlotCache:
    """The prompt cache in ``folder``, at most ``limit`` bytes of states."""

    def __init__(self, folder: str | os.PathLike[str], limit: int) -> None:
        self.folder = Path(folder)
        self.limit = limit

    # -- plumbing -----------------------------------------------------------------------

    def ensure_folder(self) -> Path:
        """The folder, created private (0700) if need be; returned for ``slot_save_path``."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)  # mkdir's mode passes through the umask
        return self.folder

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """One transaction on the index.  Its errors come out as ``OSError``: to callers
        the index is one more file that can be unreadable."""
        import sqlite3  # at first use: the server's start does not pay for it

        self.ensure_folder()
        path = self.folder / INDEX_NAME
        fresh = not path.exists()
        try:
            with closing(sqlite3.connect(path, timeout=10.0, isolation_level=None)) as db:
                if fresh:
                    os.chmod(path, 0o600)
                db.executescript(_SCHEMA)
                db.execute("BEGIN IMMEDIATE")
                try:
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise OSError(f"prompt cache index {path}: {exc}") from exc

    def _remove_file(self, name: str) -> None:
        try:
            (self.folder / name).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove prompt cache file %s: %s", name, exc)

    def _drop(self, db: sqlite3.Connection, name: str) -> None:
        db.execute("DELETE FROM states WHERE name = ?", (name,))
        self._remove_file(name)

    # -- writing ------------------------------------------------------------------------

    @staticmethod
    def temp_name() -> str:
        """A fresh file name for a runner to save a slot under (llama.cpp accepts it)."""
        return f"{TEMP_PREFIX}{secrets.token_hex(8)}{SUFFIX}"

    def commit(self, temp: str, *, key: str, model_path: str, n_saved: int) -> str | None:
        """Index the state a runner just saved as ``temp``; returns its name in the cache,
        or ``None`` when it is not kept (unreadable, larger than the bound, or already
        covered by a longer state of the same key)."""
        path = self.folder / temp
        tokens = read_state_tokens(path, n_saved)
        if tokens is None or not tokens:
            log.warning("prompt cache: slot state %s is not readable; not kept", temp)
            self._remove_file(temp)
            return None
        try:
            os.chmod(path, 0o600)  # llama.cpp creates it through the umask
            size = path.stat().st_size
        except OSError as exc:
            log.warning("prompt cache: slot state %s: %s", temp, exc)
            self._remove_file(temp)
            return None
        if size > self.limit:
            self._remove_file(temp)
            return None
        packed = _pack(tokens)
        name = hashlib.sha256(key.encode() + b"\0" + packed).hexdigest()[:40] + SUFFIX
        now = time.time()
        with self._db() as db:
            rows = db.execute("SELECT name, tokens FROM states WHERE key = ?", (key,)).fetchall()
            for other, blob in rows:
                kept = _unpack(blob)
                if other == name or (
                    len(kept) >= len(tokens) and shared_prefix(kept, tokens) == len(tokens)
                ):
                    # The same state, or one that holds this one: keep that, mark it used.
                    db.execute("UPDATE states SET used = ? WHERE name = ?", (now, other))
                    self._remove_file(temp)
                    return other if other == name else None
            for other, blob in rows:
                kept = _unpack(blob)
                if shared_prefix(kept, tokens) == len(kept):
                    self._drop(db, other)  # the new state continues it
            os.replace(path, self.folder / name)
            db.execute(
                "INSERT INTO states VALUES (?, ?, ?, ?, ?, ?, ?)",
                (name, key, model_path, len(tokens), packed, size, now),
            )
            self._evict(db)
        return name

    def _evict(self, db: sqlite3.Connection) -> None:
        """Drop the least recently used states until the rest fits the bound."""
        total = db.execute("SELECT COALESCE(SUM(size), 0) FROM states").fetchone()[0]
        if total <= self.limit:
            return
        for name, size in db.execute("SELECT name, size FROM states ORDER BY used").fetchall():
            self._drop(db, name)
            total -= size
            log.info("prompt cache: evicted %s (%d bytes)", name, size)
            if total <= self.limit:
                return

    # -- reading ------------------------------------------------------------------------

    def count(self, key: str) -> int:
        """How many states are kept under ``key`` (0 without a folder)."""
        if not (self.folder / INDEX_NAME).exists():
            return 0
        with self._db() as db:
            return int(
                db.execute("SELECT COUNT(*) FROM states WHERE key = ?", (key,)).fetchone()[0]
            )

    def states(self, key: str) -> list[tuple[str, list[int]]]:
        """The states kept under ``key``: each one's name and tokens (none without a
        folder)."""
        if not (self.folder / INDEX_NAME).exists():
            return []
        with self._db() as db:
            rows = db.execute("SELECT name, tokens FROM states WHERE key = ?", (key,)).fetchall()
        return [(str(name), _unpack(blob)) for name, blob in rows]

    def find(
        self, key: str, tokens: list[int], *, minimum: int, skip: frozenset[str] = frozenset()
    ) -> Match | None:
        """The state of ``key`` that shares the longest prefix with ``tokens``, if that
        prefix is at least ``minimum`` tokens; marked used.  A state whose file is gone or
        has changed size is dropped on the way."""
        if not (self.folder / INDEX_NAME).exists():
            return None
        best: Match | None = None
        with self._db() as db:
            rows = db.execute(
                "SELECT name, tokens, size FROM states WHERE key = ?", (key,)
            ).fetchall()
            for name, blob, size in rows:
                if name in skip:
                    continue
                kept = _unpack(blob)
                shared = shared_prefix(kept, tokens)
                if shared < minimum or (best is not None and shared <= best.shared):
                    continue
                try:
                    intact = (self.folder / name).stat().st_size == size
                except OSError:
                    intact = False
                if not intact:
                    log.warning("prompt cache: state %s is missing or truncated; dropped", name)
                    self._drop(db, name)
                    continue
                best = Match(name, shared, len(kept))
            if best is not None:
                db.execute("UPDATE states SET used = ? WHERE name = ?", (time.time(), best.name))
        return best

    def discard(self, name: str) -> None:
        """Forget a state (one llama.cpp refused to restore)."""
        with self._db() as db:
            self._drop(db, name)

    # -- housekeeping -------------------------------------------------------------------

    def forget_missing(self) -> int:
        """Drop the states of model files that are gone (a deleted model); returns how many."""
        if not (self.folder / INDEX_NAME).exists():
            return 0
        dropped = 0
        with self._db() as db:
            for name, model_path in db.execute("SELECT name, model_path FROM states").fetchall():
                if not os.path.exists(model_path):
                    self._drop(db, name)
                    dropped += 1
        if dropped:
            log.info("prompt cache: dropped %d states of deleted models", dropped)
        return dropped

    def sweep(self) -> None:
        """Remove files the index does not name (saves cut short, a lost index row) and the
        states of deleted models.  Only at start-up: a runner may be saving right now."""
        if not self.folder.is_dir():
            return
        self.forget_missing()
        with self._db() as db:
            known = {row[0] for row in db.execute("SELECT name FROM states")}
            for row in db.execute("SELECT name FROM states").fetchall():
                if not (self.folder / row[0]).exists():
                    db.execute("DELETE FROM states WHERE name = ?", (row[0],))
            for entry in os.scandir(self.folder):
                if entry.name.endswith(SUFFIX) and entry.name not in known:
                    self._remove_file(entry.name)
            self._evict(db)  # the bound may have shrunk since the last run

    def usage(self) -> tuple[int, int]:
        """(states, bytes) kept."""
        if not (self.folder / INDEX_NAME).exists():
            return 0, 0
        with self._db() as db:
            count, total = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM states"
            ).fetchone()
        return int(count), int(total)
