"""Per-key quotas: requests per minute, tokens per minute, requests at once.

Both per-minute limits are **sliding windows over the last 60 seconds**, kept as logs: the
request window holds the arrival time of each admitted request (at most ``rpm`` of them),
the token window the tokens each ended request used (prompt and generated), stamped when
it ended and merged by the second, so at most about 60 entries.  Not a token bucket: a
bucket admits a burst of its whole capacity at any moment and then trickles, so "60 a
minute" could be 120 within a minute; a sliding log never admits more than the limit in
any 60 seconds, and it knows exactly when its oldest entry leaves, which is the
``Retry-After`` the client is told.

Tokens are known only when a request ends, so they are charged then: a request is admitted
while the window's tokens are under the limit, and its own tokens may take the window over
(the next requests wait until enough of it has slid out).  A running answer is never cut:
the limits are checked at admission only.

Time is Trio's clock (``trio.current_time``), so tests run windows on the autojump clock.
The state is a key's name's, read with the key's limits at each admission: a limit
changed by ``ollamatrio keys`` applies to the next request.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType

import trio

from .keys import Limits

WINDOW = 60.0  # seconds: both limits are per minute
# Seconds a request over its concurrency limit is told to wait: no window says when one of
# the running requests ends, and a second is how long a short one takes.
CONCURRENCY_RETRY_AFTER = 1
_MERGE_WITHIN = 1.0  # token charges this close together share one entry of the log


class Limit(StrEnum):
    """Which limit refused a request (the cause in usage and the error message)."""

    RPM = "rpm"
    TPM = "tpm"
    CONCURRENCY = "concurrency"


_WORDS = {
    Limit.RPM: "requests per minute",
    Limit.TPM: "tokens per minute",
    Limit.CONCURRENCY: "concurrent requests",
}


@dataclass(frozen=True)
class OverLimit:
    """A refusal: the limit that was reached and the whole seconds until it allows again."""

    limit: Limit
    allowed: int  # the key's limit
    retry_after: int  # seconds, at least 1

    @property
    def message(self) -> str:
        return (
            f"rate limit reached: {self.allowed} {_WORDS[self.limit]};"
            f" try again in {self.retry_after}s"
        )


@dataclass
class _Window:
    """A key's state: the two logs and the requests it has running."""

    requests: deque[float] = field(default_factory=deque)  # admission times
    tokens: deque[list[float]] = field(default_factory=deque)  # [ended at, tokens]
    token_sum: float = 0
    running: int = 0

    def slide(self, now: float) -> None:
        since = now - WINDOW
        while self.requests and self.requests[0] <= since:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= since:
            self.token_sum -= self.tokens.popleft()[1]

    def idle(self) -> bool:
        return not (self.requests or self.tokens or self.running)


class Admission:
    """An admitted request's hold on its key's quota: :meth:`done` (or leaving the
    ``with`` block) gives back its concurrency and charges its tokens.  Synchronous and
    idempotent, so it runs in a ``finally`` of a cancelled request as well."""

    def __init__(self, quotas: Quotas, name: str) -> None:
        self._quotas = quotas
        self.name = name
        self._open = True

    def done(self, tokens: int = 0) -> None:
        if self._open:
            self._open = False
            self._quotas.release(self.name, tokens)

    def __enter__(self) -> Admission:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.done()


class Quotas:
    """Every key's windows, by key name."""

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self._windows: dict[str, _Window] = {}

    def admit(self, name: str, limits: Limits) -> Admission | OverLimit:
        """Admit a request of key ``name`` (counted at once against its requests per minute
        and concurrency), or the refusal that waits longest of those it is over."""
        now = self._clock()
        window = self._windows.get(name)
        if window is None:
            window = self._windows[name] = _Window()
        window.slide(now)
        refusals: list[OverLimit] = []
        if limits.concurrency and window.running >= limits.concurrency:
            refusals.append(
                OverLimit(Limit.CONCURRENCY, limits.concurrency, CONCURRENCY_RETRY_AFTER)
            )
        if limits.rpm and len(window.requests) >= limits.rpm:
            # The request that leaves the window first makes room for one.
            oldest = window.requests[len(window.requests) - limits.rpm]
            refusals.append(OverLimit(Limit.RPM, limits.rpm, _seconds(oldest + WINDOW - now)))
        if limits.tpm and window.token_sum >= limits.tpm:
            free_at = _tokens_free_at(window, limits.tpm)
            refusals.append(OverLimit(Limit.TPM, limits.tpm, _seconds(free_at - now)))
        if refusals:
            if window.idle():
                del self._windows[name]
            return max(refusals, key=lambda r: r.retry_after)
        window.requests.append(now)
        window.running += 1
        return Admission(self, name)

    def release(self, name: str, tokens: int) -> None:
        """A request of ``name`` ended, having used ``tokens``."""
        window = self._windows[name]
        window.running -= 1
        if tokens > 0:
            now = self._clock()
            if window.tokens and now - window.tokens[-1][0] < _MERGE_WITHIN:
                # Stamped with the later time: merged tokens leave the window late, never early.
                window.tokens[-1][0] = now
                window.tokens[-1][1] += tokens
            else:
                window.tokens.append([now, tokens])
            window.token_sum += tokens
        window.slide(self._clock())
        if window.idle():
            del self._windows[name]

    def running(self, name: str) -> int:
        """The requests of ``name`` admitted and not yet done."""
        window = self._windows.get(name)
        return 0 if window is None else window.running


def _tokens_free_at(window: _Window, tpm: int) -> float:
    """When enough of the token log has slid out that the sum is under ``tpm``."""
    remaining = window.token_sum
    for ended_at, tokens in window.tokens:
        remaining -= tokens
        if remaining < tpm:
            return ended_at + WINDOW
    return window.tokens[-1][0] + WINDOW  # not reached: the sum was at least tpm


def _seconds(delay: float) -> int:
    """Whole seconds, rounded up: a client that waits this long is admitted."""
    return max(1, math.ceil(delay))
