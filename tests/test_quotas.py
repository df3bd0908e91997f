"""Per-key quotas (auth/quotas.py) and the usage ledger and table (auth/usage.py), on their
own: the windows on Trio's autojump clock, the table in a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ollamatrio.auth.keys import Limits
from ollamatrio.auth.quotas import Admission, Limit, OverLimit, Quotas
from ollamatrio.auth.usage import Counts, RequestUsage, UsageLedger, UsageStore, day_of


def admitted(result: Admission | OverLimit) -> Admission:
    assert isinstance(result, Admission), result
    return result


def refused(result: Admission | OverLimit) -> OverLimit:
    assert isinstance(result, OverLimit), result
    return result


async def test_requests_per_minute_slide(autojump_clock: trio.abc.Clock) -> None:
    quotas = Quotas()
    limits = Limits(rpm=2)
    admitted(quotas.admit("a", limits)).done()
    await trio.sleep(10)
    admitted(quotas.admit("a", limits)).done()
    over = refused(quotas.admit("a", limits))
    assert (over.limit, over.allowed, over.retry_after) == (Limit.RPM, 2, 50)
    assert "2 requests per minute" in over.message
    await trio.sleep(49)
    assert refused(quotas.admit("a", limits)).retry_after == 1  # refusals take no room
    await trio.sleep(1)  # the first request has left the window
    admitted(quotas.admit("a", limits)).done()
    assert refused(quotas.admit("a", limits)).retry_after == 10
    # Another key has a window of its own.
    admitted(quotas.admit("b", limits)).done()


async def test_retry_after_is_whole_seconds_rounded_up(autojump_clock: trio.abc.Clock) -> None:
    quotas = Quotas()
    admitted(quotas.admit("a", Limits(rpm=1))).done()
    await trio.sleep(0.25)
    assert refused(quotas.admit("a", Limits(rpm=1))).retry_after == 60  # 59.75 s
    await trio.sleep(59.5)
    assert refused(quotas.admit("a", Limits(rpm=1))).retry_after == 1  # 0.25 s
    await trio.sleep(0.25)
    admitted(quotas.admit("a", Limits(rpm=1)))


async def test_tokens_are_charged_when_a_request_ends(autojump_clock: trio.abc.Clock) -> None:
    quotas = Quotas()
    limits = Limits(tpm=100)
    first = admitted(quotas.admit("a", limits))
    second = admitted(quotas.admit("a", limits))  # nothing charged yet: both run
    first.done(60)
    await trio.sleep(5)
    admitted(quotas.admit("a", limits)).done(0)  # 60 < 100: admitted
    second.done(50)  # over the limit after the fact: the next ones wait
    over = refused(quotas.admit("a", limits))
    # 110 tokens: once the first 60 leave (at 60 s), 50 < 100.
    assert (over.limit, over.retry_after) == (Limit.TPM, 55)
    await trio.sleep(55)
    admitted(quotas.admit("a", limits)).done()
    second.done(1000)  # done twice: charged once
    admitted(quotas.admit("a", limits))


async def test_concurrency_is_given_back_also_when_cancelled(
    autojump_clock: trio.abc.Clock,
) -> None:
    quotas = Quotas()
    limits = Limits(concurrency=1)
    with trio.move_on_after(1):
        with admitted(quotas.admit("a", limits)):
            over = refused(quotas.admit("a", limits))
            assert (over.limit, over.retry_after) == (Limit.CONCURRENCY, 1)
            assert quotas.running("a") == 1
            await trio.sleep_forever()
    assert quotas.running("a") == 0
    admitted(quotas.admit("a", limits)).done()


async def test_the_longest_wait_is_told(autojump_clock: trio.abc.Clock) -> None:
    quotas = Quotas()
    limits = Limits(rpm=1, concurrency=1)
    held = admitted(quotas.admit("a", limits))
    assert refused(quotas.admit("a", limits)).limit is Limit.RPM  # 60 s beats 1 s
    held.done()


def test_no_limits_admit_everything() -> None:
    quotas = Quotas(clock=lambda: 0.0)
    for _ in range(1000):
        admitted(quotas.admit("a", Limits()))
    assert quotas.running("a") == 1000


def test_the_ledger_keeps_totals_and_rows_until_taken() -> None:
    ledger = UsageLedger(clock=lambda: 86400.0 * 3 + 5)  # 1970-01-04
    ledger.record("alice", RequestUsage(prompt_tokens=10, prompt_tokens_reused=4,
                                        generated_tokens=7))  # fmt: skip
    ledger.record("alice", RequestUsage(refused="rate_limited_tpm"))
    assert ledger.pending.is_set()
    alice = ledger.since_start["alice"]
    assert (alice.requests, alice.prompt_tokens, alice.prompt_tokens_reused) == (1, 10, 4)
    assert (alice.generated_tokens, alice.rate_limited_tpm) == (7, 1)
    rows = ledger.take()
    assert list(rows) == [("alice", "1970-01-04")]
    assert not ledger.pending.is_set()
    assert ledger.take() == {}
    ledger.put_back(rows)  # a failed write: kept for the next
    assert ledger.pending.is_set()
    assert ledger.take() == rows
    assert ledger.since_start["alice"].requests == 1  # totals are not taken


def test_the_usage_table_adds_up_by_key_and_day(tmp_path: Path) -> None:
    store = UsageStore.in_folder(tmp_path / "state")
    store.add({("alice", "2026-11-28"): Counts(requests=1, generated_tokens=5)})
    store.add({
        ("alice", "2026-11-28"): Counts(requests=2, forbidden=1),
        ("alice", "2026-11-29"): Counts(requests=1),
        ("bob", "2026-11-29"): Counts(rate_limited_rpm=3),
    })  # fmt: skip
    read = UsageStore(store.path).read()  # another process's view
    assert read["alice"]["2026-11-28"] == Counts(requests=3, generated_tokens=5, forbidden=1)
    assert list(read["alice"]) == ["2026-11-28", "2026-11-29"]
    assert read["bob"]["2026-11-29"].rate_limited_rpm == 3
    assert oct(store.path.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(("timestamp", "day"), [(0, "1970-01-01"), (86399.9, "1970-01-01"),
                                                 (86400, "1970-01-02")])  # fmt: skip
def test_days_are_utc(timestamp: float, day: str) -> None:
    assert day_of(timestamp) == day
