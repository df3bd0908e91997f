"""API keys: an embedded SQLite table in the server's state folder (``OLLAMATRIO_DATA``).

A key's secret is shown once, when it is created, and never stored: the table keeps its
SHA-256 digest, and a short non-secret prefix that names the key in logs and listings and
finds its row.  A secret is 32 random bytes, so a plain digest is safe (nothing to guess
from it, no dictionary to try); the digests are compared in constant time.

Every method blocks (sqlite3): the server calls them off the Trio thread, the command line
(``ollamatrio keys``) directly, with or without a server running.  Each call opens its own
connection and WAL lets readers run beside a writer, so a key created or revoked from the
command line is seen by the server's next reading of the table.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from .state_file import StateTable

SECRET_PREFIX = "otk_"  # what every secret starts with, so a leaked one is recognisable
PREFIX_LENGTH = 8  # characters after SECRET_PREFIX that name a key publicly
SCOPES = ("inference", "admin", "metrics")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    name TEXT PRIMARY KEY,
    prefix TEXT NOT NULL UNIQUE,
    digest BLOB NOT NULL,
    scopes TEXT NOT NULL,
    rpm INTEGER NOT NULL DEFAULT 0,
    tpm INTEGER NOT NULL DEFAULT 0,
    concurrency INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    last_used_at REAL
);
"""


class KeyRequestError(ValueError):
    """A key cannot be created or found as asked (a bad name or scope, a duplicate)."""


@dataclass(frozen=True)
class Limits:
    """Per-key quotas; 0 is no limit."""

    rpm: int = 0  # requests per minute
    tpm: int = 0  # tokens per minute: prompt and generated, counted after each request
    concurrency: int = 0  # requests at once


@dataclass(frozen=True)
class ApiKey:
    """A key as listed: everything but its secret."""

    name: str
    prefix: str
    scopes: frozenset[str]
    limits: Limits = field(default_factory=Limits)
    created_at: float = 0.0
    last_used_at: float | None = None


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def prefix_of(secret: str) -> str | None:
    """The public prefix inside a secret, or None if it is not one of ours."""
    if not secret.startswith(SECRET_PREFIX):
        return None
    prefix = secret[len(SECRET_PREFIX) : len(SECRET_PREFIX) + PREFIX_LENGTH]
    return prefix if len(prefix) == PREFIX_LENGTH else None


class KeyStore(StateTable):
    """The key table at ``path`` (created with its folder on first use)."""

    SCHEMA = _SCHEMA

    def create(
        self, name: str, scopes: Iterable[str], limits: Limits | None = None
    ) -> tuple[ApiKey, str]:
        """A new key and its secret (shown once; only its digest is kept)."""
        if not _NAME.fullmatch(name):
            raise KeyRequestError(f"invalid key name {name!r}: letters, digits and ._@- (1-64)")
        chosen = frozenset(scopes)
        if not chosen or chosen - set(SCOPES):
            raise KeyRequestError(f"scopes must be among {', '.join(SCOPES)}, got {sorted(chosen)}")
        limits = limits or Limits()
        if min(limits.rpm, limits.tpm, limits.concurrency) < 0:
            raise KeyRequestError("limits must be 0 (none) or positive")
        import sqlite3

        while True:
            secret = SECRET_PREFIX + secrets.token_urlsafe(32).replace("-", "x").replace("_", "y")
            prefix = secret[len(SECRET_PREFIX) : len(SECRET_PREFIX) + PREFIX_LENGTH]
            key = ApiKey(name, prefix, chosen, limits, created_at=time.time())
            try:
                with self._connect() as db:
                    db.execute(
                        "INSERT INTO api_keys (name, prefix, digest, scopes, rpm, tpm,"
                        " concurrency, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (name, prefix, digest(secret), " ".join(sorted(chosen)), limits.rpm,
                         limits.tpm, limits.concurrency, key.created_at),
                    )  # fmt: skip
            except sqlite3.IntegrityError as exc:
                if "api_keys.name" in str(exc):
                    raise KeyRequestError(f"a key named {name!r} exists already") from None
                continue  # a prefix taken already (one in 2^47): draw another secret
            return key, secret

    def list(self) -> list[ApiKey]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT name, prefix, scopes, rpm, tpm, concurrency, created_at, last_used_at"
                " FROM api_keys ORDER BY created_at"
            ).fetchall()
        return [_key(row) for row in rows]

    def revoke(self, name: str) -> bool:
        """Remove the key; True if it existed."""
        with self._connect() as db:
            return db.execute("DELETE FROM api_keys WHERE name = ?", (name,)).rowcount > 0

    def verify(self, secret: str) -> ApiKey | None:
        """The key whose secret this is, or None (unknown or revoked)."""
        prefix = prefix_of(secret)
        if prefix is None:
            return None
        with self._connect() as db:
            row = db.execute(
                "SELECT name, prefix, scopes, rpm, tpm, concurrency, created_at, last_used_at,"
                " digest FROM api_keys WHERE prefix = ?",
                (prefix,),
            ).fetchone()
        if row is None or not hmac.compare_digest(row[8], digest(secret)):
            return None
        return _key(row[:8])

    def all_digests(self) -> dict[bytes, ApiKey]:
        """Every key by its digest: what a server holds in memory between readings."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT name, prefix, scopes, rpm, tpm, concurrency, created_at, last_used_at,"
                " digest FROM api_keys"
            ).fetchall()
        return {bytes(row[8]): _key(row[:8]) for row in rows}

    def mark_used(self, uses: dict[str, float]) -> None:
        """Record when each key (by name) was last used."""
        if not uses:
            return
        with self._connect() as db:
            db.executemany(
                "UPDATE api_keys SET last_used_at = ? WHERE name = ?",
                [(at, name) for name, at in uses.items()],
            )


def _key(row: tuple[object, ...]) -> ApiKey:
    name, prefix, scopes, rpm, tpm, concurrency, created_at, last_used_at = row
    return ApiKey(
        name=str(name),
        prefix=str(prefix),
        scopes=frozenset(str(scopes).split()),
        limits=Limits(int(rpm), int(tpm), int(concurrency)),  # type: ignore[call-overload]
        created_at=float(created_at),  # type: ignore[arg-type]
        last_used_at=None if last_used_at is None else float(last_used_at),  # type: ignore[arg-type]
    )
