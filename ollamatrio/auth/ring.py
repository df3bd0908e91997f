"""The server's copy of the key table: digest -> key, in memory, never read on the Trio thread.

A request's key is found by the SHA-256 digest of the secret it presents, a dict lookup (the
digest is no secret: nothing about the secret can be learnt from how long it takes).  The
table is read again, off the Trio thread, when a request arrives and the copy is a second old
or more, so a key created or revoked from the command line counts within a second, with no
restart, and an idle server reads nothing.  Last use is recorded in memory and written with
the next reading that comes ``FLUSH_EVERY`` seconds or more after the last write.
"""

from __future__ import annotations

import logging
import math
import time

import trio

from .keys import ApiKey, KeyStore, digest

log = logging.getLogger(__name__)

REREAD_AFTER = 1.0  # seconds a reading of the table serves requests
FLUSH_EVERY = 5.0  # seconds between writes of the keys' last use


class KeyRing:
    """The keys of ``store`` as the server sees them."""

    def __init__(self, store: KeyStore) -> None:
        self.store = store
        self._keys: dict[bytes, ApiKey] | None = None
        self._read_at = -math.inf  # trio.current_time() when the last reading began
        self._flushed_at = -math.inf
        self._uses: dict[str, float] = {}  # key name -> time.time() of its last request
        self._reading = trio.Lock()

    async def key_for(self, secret: str) -> ApiKey | None:
        """The key whose secret this is, or None (unknown or revoked)."""
        keys = await self._fresh()
        key = keys.get(digest(secret))
        if key is not None:
            self._uses[key.name] = time.time()
        return key

    async def _fresh(self) -> dict[bytes, ApiKey]:
        keys = self._keys
        if keys is not None and (
            trio.current_time() - self._read_at < REREAD_AFTER or self._reading.locked()
        ):
            return keys  # recent, or being read again now: a request need not wait for it
        async with self._reading:
            if self._keys is not None and trio.current_time() - self._read_at < REREAD_AFTER:
                return self._keys
            started = trio.current_time()
            uses: dict[str, float] = {}
            if started - self._flushed_at >= FLUSH_EVERY:
                uses, self._uses = self._uses, {}
            try:
                self._keys = await trio.to_thread.run_sync(self._read, uses)
            except BaseException:
                self._uses = {**uses, **self._uses}  # written with the next reading
                raise
            self._read_at = started
            if uses:
                self._flushed_at = started
            return self._keys

    def _read(self, uses: dict[str, float]) -> dict[bytes, ApiKey]:
        if uses:
            self.store.mark_used(uses)
        keys = self.store.all_digests()
        if self._keys is not None and len(keys) != len(self._keys):
            log.info("API keys: %d (was %d)", len(keys), len(self._keys))
        return keys
