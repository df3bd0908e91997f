"""Each key's usage, served: ``GET /api/usage`` (admin), the per-key series of ``/metrics``,
and the task that writes the ledger to SQLite.

The request chain records into a :class:`~..auth.usage.UsageLedger` in memory, with no I/O;
:func:`write_usage` is a task in the app's nursery that waits for rows, writes them in one
transaction off the Trio thread, then waits :data:`WRITE_EVERY` before the next batch, so
a busy server writes at most once per interval; at shutdown (its cancellation) it writes
what is left.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import trio
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from quart import Response

from ..auth.usage import REFUSAL_CAUSES, Counts, UsageLedger, UsageStore
from ..wire import rfc3339_from_timestamp
from .answers import json_response

log = logging.getLogger(__name__)

WRITE_EVERY = 2.0  # seconds between two writes of the ledger at most
SHUTDOWN_WRITE_TIMEOUT = 5.0  # seconds the last write may take at shutdown


async def write_usage(ledger: UsageLedger, store: UsageStore, every: float = WRITE_EVERY) -> None:
    """Write the ledger's rows as they come, until cancelled; then the rest."""
    try:
        while True:
            await ledger.pending.wait()
            await _write(ledger, store)
            await trio.sleep(every)
    finally:
        # Shielded: the rows of the last seconds are written even as the server stops.
        with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_WRITE_TIMEOUT):
            await _write(ledger, store)


async def _write(ledger: UsageLedger, store: UsageStore) -> None:
    rows = ledger.take()
    if not rows:
        return
    try:
        await trio.to_thread.run_sync(store.add, rows)
    except Exception as exc:  # a full or unreadable disk must not end the server
        log.warning("writing key usage failed (kept for the next try): %s", exc)
        ledger.put_back(rows)


class UsageView:
    """``GET /api/usage``: every key's usage, all time and by day, and since this server
    started.  What the ledger holds unwritten is written first, so the answer is whole."""

    def __init__(self, ledger: UsageLedger, store: UsageStore) -> None:
        self.ledger = ledger
        self.store = store
        self.started_at = time.time()

    async def usage(self) -> Response:
        return json_response(await self.document())

    async def document(self) -> dict[str, Any]:
        """The answer's body (also the fleet gateway's, which serves it without Quart)."""
        await _write(self.ledger, self.store)
        stored = await trio.to_thread.run_sync(self.store.read)
        keys = []
        for name in sorted(stored.keys() | self.ledger.since_start.keys()):
            days = stored.get(name, {})
            total = Counts()
            for counts in days.values():
                total.add(counts)
            keys.append({
                "name": name,
                "total": total.to_json(),
                "since_start": self.ledger.since_start.get(name, Counts()).to_json(),
                "days": [{"day": day, **counts.to_json()} for day, counts in days.items()],
            })  # fmt: skip
        return {"started_at": rfc3339_from_timestamp(self.started_at), "keys": keys}


class KeyUsageSeries(Collector):
    """``/metrics``: each key's usage since the server started, labelled by key name.  Only
    keys that were used appear (bounded by the keys that exist); without authentication no
    key is, and there are no such series."""

    def __init__(self, ledger: UsageLedger) -> None:
        self._ledger = ledger

    def collect(self) -> Iterable[Metric]:
        families = {
            "requests": CounterMetricFamily(
                "ollamatrio_key_requests", "Requests admitted, by API key", labels=["key"]
            ),
            "prompt_tokens": CounterMetricFamily(
                "ollamatrio_key_prompt_tokens",
                "Prompt tokens evaluated, by API key (reused ones not counted)",
                labels=["key"],
            ),
            "prompt_tokens_reused": CounterMetricFamily(
                "ollamatrio_key_prompt_tokens_reused",
                "Prompt tokens reused from a cache instead of evaluated, by API key",
                labels=["key"],
            ),
            "generated_tokens": CounterMetricFamily(
                "ollamatrio_key_tokens_generated", "Tokens generated, by API key", labels=["key"]
            ),
        }
        refusals = CounterMetricFamily(
            "ollamatrio_key_refusals",
            "Requests refused, by API key and cause (unauthorized, forbidden, "
            "rate_limited_rpm, rate_limited_tpm, rate_limited_concurrency)",
            labels=["key", "cause"],
        )
        used = sorted(self._ledger.since_start.items())
        if not used:
            return
        for name, counts in used:
            for field_name, family in families.items():
                family.add_metric([name], getattr(counts, field_name))
            for cause in REFUSAL_CAUSES:
                if getattr(counts, cause):
                    refusals.add_metric([name, cause], getattr(counts, cause))
        yield from families.values()
        yield refusals
