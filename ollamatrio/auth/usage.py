"""Usage per key: requests, prompt tokens evaluated and reused, generated tokens, refusals by
cause, per UTC day.

Two halves.  :class:`UsageLedger` is in memory and synchronous: the request chain records
each request as it ends (no I/O, no checkpoint), into the totals since the server started
and into the rows not yet written.  :class:`UsageStore` is the ``usage`` table in the key
table's file (``auth.sqlite3``), one row per key and day, added to in batches; its methods
block (sqlite3), so the server calls them off the Trio thread (the writer task in
``api/usage.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    pass

from .state_file import StateTable

# The causes a request is refused for, as counted.
UNAUTHORIZED = "unauthorized"  # no key, an unknown or a revoked one (401)
FORBIDDEN = "forbidden"  # a key without the route's scope (403)
RATE_LIMITED = "rate_limited"  # prefix: rate_limited_rpm, _tpm, _concurrency (429)
REFUSAL_CAUSES = (
    UNAUTHORIZED,
    FORBIDDEN,
    f"{RATE_LIMITED}_rpm",
    f"{RATE_LIMITED}_tpm",
    f"{RATE_LIMITED}_concurrency",
)
NO_KEY = "-"  # the name refusals without a key (unauthorized) are counted under

_SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    key TEXT NOT NULL,
    day TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    prompt_tokens_reused INTEGER NOT NULL DEFAULT 0,
    generated_tokens INTEGER NOT NULL DEFAULT 0,
    unauthorized INTEGER NOT NULL DEFAULT 0,
    forbidden INTEGER NOT NULL DEFAULT 0,
    rate_limited_rpm INTEGER NOT NULL DEFAULT 0,
    rate_limited_tpm INTEGER NOT NULL DEFAULT 0,
    rate_limited_concurrency INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, day)
);
"""


@dataclass
class Counts:
    """One key's usage over some time."""

    requests: int = 0  # requests admitted (refused ones are counted by cause)
    prompt_tokens: int = 0  # evaluated (reused ones not counted)
    prompt_tokens_reused: int = 0  # taken from the runner's slot or prompt cache
    generated_tokens: int = 0
    unauthorized: int = 0
    forbidden: int = 0
    rate_limited_rpm: int = 0
    rate_limited_tpm: int = 0
    rate_limited_concurrency: int = 0

    def add(self, other: Counts) -> None:
        for f in _FIELDS:
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def to_json(self) -> dict[str, object]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_reused": self.prompt_tokens_reused,
            "generated_tokens": self.generated_tokens,
            "refusals": {cause: getattr(self, cause) for cause in REFUSAL_CAUSES},
        }


_FIELDS = tuple(f.name for f in fields(Counts))


@dataclass(frozen=True)
class RequestUsage:
    """What one request used: its tokens (from its final chunk) or its refusal's cause."""

    prompt_tokens: int = 0  # evaluated
    prompt_tokens_reused: int = 0
    generated_tokens: int = 0
    refused: str | None = None  # one of REFUSAL_CAUSES

    @property
    def tokens(self) -> int:
        """What counts against tokens per minute: the whole prompt and the generated."""
        return self.prompt_tokens + self.prompt_tokens_reused + self.generated_tokens


def day_of(timestamp: float) -> str:
    """The UTC day of a wall-clock ``timestamp``: ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.gmtime(timestamp))


@dataclass
class UsageLedger:
    """Usage in memory: totals since start by key name, and the rows not yet written.

    :attr:`pending` is set while there are rows to write; the writer waits on it."""

    clock: Callable[[], float] = field(
        default=time.time, repr=False
    )  # wall clock: days are calendar days
    since_start: dict[str, Counts] = field(default_factory=dict)
    _unwritten: dict[tuple[str, str], Counts] = field(default_factory=dict)
    pending: trio.Event = field(default_factory=trio.Event)

    def record(self, name: str, used: RequestUsage) -> None:
        """One request of key ``name`` ended (or was refused)."""
        counts = Counts()
        if used.refused is not None:
            setattr(counts, used.refused, 1)
        else:
            counts.requests = 1
            counts.prompt_tokens = used.prompt_tokens
            counts.prompt_tokens_reused = used.prompt_tokens_reused
            counts.generated_tokens = used.generated_tokens
        day = day_of(self.clock())
        self.since_start.setdefault(name, Counts()).add(counts)
        self._unwritten.setdefault((name, day), Counts()).add(counts)
        self.pending.set()

    def take(self) -> dict[tuple[str, str], Counts]:
        """The rows to write, by (key name, day); the ledger forgets them."""
        rows, self._unwritten = self._unwritten, {}
        if self.pending.is_set():
            self.pending = trio.Event()
        return rows

    def put_back(self, rows: dict[tuple[str, str], Counts]) -> None:
        """Rows that could not be written: kept for the next try."""
        for at, counts in rows.items():
            self._unwritten.setdefault(at, Counts()).add(counts)
        if rows:
            self.pending.set()


class UsageStore(StateTable):
    """The ``usage`` table at ``path`` (the key table's file; created on first use)."""

    SCHEMA = _SCHEMA

    def add(self, rows: dict[tuple[str, str], Counts]) -> None:
        """Add ``rows`` (by key name and day) to the table, in one transaction."""
        if not rows:
            return
        columns = ", ".join(_FIELDS)
        marks = ", ".join("?" * len(_FIELDS))
        updates = ", ".join(f"{f} = {f} + excluded.{f}" for f in _FIELDS)
        with self._connect() as db:
            db.executemany(
                f"INSERT INTO usage (key, day, {columns}) VALUES (?, ?, {marks})"
                f" ON CONFLICT (key, day) DO UPDATE SET {updates}",
                [(k, d, *(getattr(c, f) for f in _FIELDS)) for (k, d), c in rows.items()],
            )

    def read(self) -> dict[str, dict[str, Counts]]:
        """Every row: by key name, then by day (oldest first)."""
        with self._connect() as db:
            rows = db.execute(
                f"SELECT key, day, {', '.join(_FIELDS)} FROM usage ORDER BY key, day"
            ).fetchall()
        found: dict[str, dict[str, Counts]] = {}
        for key, day, *values in rows:
            found.setdefault(str(key), {})[str(day)] = Counts(*(int(v) for v in values))
        return found
