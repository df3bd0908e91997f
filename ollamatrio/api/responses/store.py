"""Stored OpenAI Responses (``/v1/responses`` with ``store``): an embedded SQLite database.

One row per response: the response object as it was answered, the input items of its own
request, and the whole conversation the model was given (earlier turns' items, then this
request's), so that a ``previous_response_id`` continues from one row without walking a
chain, and deleting an earlier response never breaks a later one.  Rows older than the
retention (``OLLAMATRIO_RESPONSES_TTL``) count as gone and are pruned.

Every method here blocks (sqlite3); callers run them off the Trio thread
(``trio.to_thread.run_sync``).  Each call opens its own connection, so worker threads share
nothing; WAL lets readers run beside the one writer.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ResponseNotFoundError

FILE_NAME = "responses.sqlite3"
DEFAULT_TTL = 30 * 24 * 3600.0  # seconds: OpenAI keeps stored responses for 30 days

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    response TEXT NOT NULL,
    input TEXT NOT NULL,
    conversation TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created_at ON responses (created_at);
"""


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: its object, its request's input items, and every item the
    model was given for it (the conversation so far, its own input last)."""

    id: str
    response: dict[str, Any]
    input: list[dict[str, Any]]
    conversation: list[dict[str, Any]]

    def history(self) -> list[dict[str, Any]]:
        """What a response continuing this one starts from: its conversation, then its
        output items."""
        return [*self.conversation, *self.response.get("output", ())]


class ResponseStore:
    """The database at ``path`` (created with its folder on first use); rows live for
    ``ttl`` seconds (``math.inf``: forever)."""

    def __init__(self, path: Path, ttl: float = DEFAULT_TTL) -> None:
        self.path = path
        self.ttl = ttl
        self._ready = False

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        if not self._ready:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(self.path, timeout=30.0)) as db:
            if not self._ready:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(_SCHEMA)
                self._ready = True  # idempotent: two threads may both get here first
            with db:  # one transaction: committed, or rolled back on an error
                yield db

    def _oldest_kept(self, now: float) -> float:
        return now - self.ttl if self.ttl != float("inf") else float("-inf")

    def put(
        self, response: dict[str, Any], input_items: Sequence[dict[str, Any]],
        conversation: Sequence[dict[str, Any]],
    ) -> None:  # fmt: skip
        """Store (or replace) ``response`` by its id."""
        row = (
            response["id"], time.time(), json.dumps(response), json.dumps(list(input_items)),
            json.dumps(list(conversation)),
        )  # fmt: skip
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)", row)

    def get(self, response_id: str) -> StoredResponse:
        """The stored response ``response_id``; :class:`ResponseNotFoundError` if it was
        never stored, was deleted, or has expired."""
        with self._connect() as db:
            row = db.execute(
                "SELECT response, input, conversation FROM responses"
                " WHERE id = ? AND created_at >= ?",
                (response_id, self._oldest_kept(time.time())),
            ).fetchone()
        if row is None:
            raise ResponseNotFoundError(f"Response with id '{response_id}' not found.")
        return StoredResponse(response_id, *(json.loads(column) for column in row))

    def delete(self, response_id: str) -> None:
        """Forget ``response_id``; :class:`ResponseNotFoundError` if there is none."""
        with self._connect() as db:
            gone = db.execute(
                "DELETE FROM responses WHERE id = ? AND created_at >= ?",
                (response_id, self._oldest_kept(time.time())),
            ).rowcount
        if not gone:
            raise ResponseNotFoundError(f"Response with id '{response_id}' not found.")

    def prune(self, now: float | None = None) -> int:
        """Delete the rows past the retention; how many went."""
        oldest = self._oldest_kept(time.time() if now is None else now)
        with self._connect() as db:
            return db.execute("DELETE FROM responses WHERE created_at < ?", (oldest,)).rowcount
