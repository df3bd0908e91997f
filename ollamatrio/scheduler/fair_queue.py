"""A runner's parallel slots, shared fairly between the principals that wait for them.

Requests that find a slot free and nobody waiting take it at once (:meth:`SlotQueue.try_take`,
no checkpoint).  The others wait here, each in its principal's queue, and a slot that
comes free goes to the next request by deficit round-robin weighted by cost (the prompt's
tokens, estimated before tokenizing): every principal with requests waiting is visited in
turn and given :data:`QUANTUM` tokens of credit per turn, and its next request is served
once its credit covers that request's cost.  So one principal's twelve long prompts cannot
keep another's short question waiting behind all of them: the short one is served at its
principal's first turn.  Within a principal, ``batch`` requests wait behind its
``interactive`` ones; between principals only the round-robin decides (a principal with
only batch work still gets its share).

Trio style: the queue's state belongs to whichever task runs; waiters wait on their own
:class:`trio.Event`.  A slot is handed straight to the waiter it goes to (released and
granted in one synchronous step), so a newcomer cannot take it meanwhile; a waiter
cancelled before it was granted leaves its principal's queue (and a principal with nothing
left waiting leaves the round with its credit), one cancelled after passes the slot on; a
slot released while nobody waits is kept for the next request.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

import trio

Priority = Literal["interactive", "batch"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "batch")

#: Tokens of credit a principal gets per turn: small against a long prompt, so that a short
#: request of another principal is never behind more than the request being served.
QUANTUM = 256


class _Waiter:
    __slots__ = ("cost", "granted", "priority")

    def __init__(self, cost: int, priority: Priority) -> None:
        self.cost = cost
        self.priority = priority
        self.granted = trio.Event()


class _Principal:
    """One principal's waiting requests (interactive first) and its round-robin credit."""

    __slots__ = ("batch", "deficit", "interactive", "name", "turn")

    def __init__(self, name: str) -> None:
        self.name = name
        self.interactive: deque[_Waiter] = deque()
        self.batch: deque[_Waiter] = deque()
        self.deficit = 0
        self.turn = False  # its turn has begun (this turn's credit was given)

    def lane(self, priority: Priority) -> deque[_Waiter]:
        return self.interactive if priority == "interactive" else self.batch

    def head(self) -> _Waiter:
        return self.interactive[0] if self.interactive else self.batch[0]

    def pop(self) -> _Waiter:
        return self.interactive.popleft() if self.interactive else self.batch.popleft()

    def __bool__(self) -> bool:
        return bool(self.interactive or self.batch)


class SlotQueue:
    """``slots`` parallel slots.  With ``fair=False`` every request is served in arrival
    order, whatever its principal or priority (first come, first served)."""

    def __init__(self, slots: int, *, fair: bool = True) -> None:
        self.free = slots
        self.fair = fair
        self._principals: dict[str, _Principal] = {}
        self._round: deque[_Principal] = deque()  # principals with requests waiting
        self.waiting = 0

    def try_take(self) -> bool:
        """Take a slot if one is free and nobody waits for one (no checkpoint)."""
        if self.free > 0 and self.waiting == 0:
            self.free -= 1
            return True
        return False

    async def take(
        self, principal: str = "", priority: Priority = "interactive", cost: int = 1
    ) -> None:
        """Wait for a slot, in ``principal``'s queue; cancellation leaves nothing behind."""
        if self.try_take():
            await trio.lowlevel.checkpoint()
            return
        if not self.fair:
            principal, priority = "", "interactive"
        waiter = _Waiter(max(1, cost), priority)
        owner = self._principals.get(principal)
        if owner is None:
            owner = self._principals[principal] = _Principal(principal)
            self._round.append(owner)
        owner.lane(priority).append(waiter)
        self.waiting += 1
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter.granted.is_set():
                self.release()  # granted, then cancelled before it ran: pass it on
            else:
                self._withdraw(owner, waiter)
            raise

    def release(self) -> None:
        """Give a slot back: to the next waiter, or kept free if nobody waits."""
        waiter = self._next()
        if waiter is None:
            self.free += 1
        else:
            waiter.granted.set()

    # -- the round --------------------------------------------------------------------------

    def _withdraw(self, owner: _Principal, waiter: _Waiter) -> None:
        owner.lane(waiter.priority).remove(waiter)
        self.waiting -= 1
        if not owner:
            self._leave(owner)

    def _leave(self, owner: _Principal) -> None:
        """A principal with nothing left waiting leaves the round, and its credit with it."""
        self._round.remove(owner)
        del self._principals[owner.name]

    def _next(self) -> _Waiter | None:
        """The waiter the next free slot goes to (taken off its queue), or None."""
        if not self._round:
            return None
        self.waiting -= 1
        if not self.fair:  # one principal, one lane: arrival order
            owner = self._round[0]
            waiter = owner.pop()
            if not owner:
                self._leave(owner)
            return waiter
        return self._next_fair()

    def _next_fair(self) -> _Waiter:
        round_ = self._round
        visited = 0
        while True:
            owner = round_[0]
            if not owner.turn:
                owner.turn = True
                owner.deficit += QUANTUM
            waiter = owner.head()
            if waiter.cost <= owner.deficit:
                owner.deficit -= waiter.cost
                owner.pop()
                if not owner:
                    self._leave(owner)
                return waiter
            owner.turn = False
            round_.rotate(-1)
            visited += 1
            if visited == len(round_):
                self._skip_idle_rounds()
                visited = 0

    def _skip_idle_rounds(self) -> None:
        """After a whole round served nobody: give every principal at once the credit of the
        further rounds in which nobody would be served either (a long prompt needs many)."""
        rounds = min(math.ceil((p.head().cost - p.deficit) / QUANTUM) for p in self._round)
        for owner in self._round:
            owner.deficit += (rounds - 1) * QUANTUM
