"""Fair share of a runner's slots between principals (scheduler/fair_queue.py): deficit
round-robin weighted by each request's cost, priority within a principal, cancellation, the
queue limit; on the simulated engine in virtual time, and once with a real runner."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import test_scheduler
import test_scheduler_runners
import trio

from ollamatrio.config import Settings
from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.errors import QueueFullError
from ollamatrio.scheduler import ModelRequest, Scheduler, open_scheduler
from ollamatrio.scheduler.fair_queue import QUANTUM, SlotQueue
from ollamatrio.types import CompletionRequest

models = test_scheduler.models  # the sparse GB-sized models, as a fixture here too
req = test_scheduler.req
scheduler = test_scheduler.scheduler
cpu_only = test_scheduler_runners.cpu_only

LONG = 12_000  # tokens of a coding agent's prompt
SHORT = 5


async def hold(
    sched: Scheduler, request: ModelRequest, seconds: float, served: list[str], name: str
) -> None:
    async with sched.lease(request):
        served.append(name)
        await trio.sleep(seconds)


# -- the scheduler, simulated engine ------------------------------------------------------


@pytest.mark.parametrize(("fair", "most_wait"), [(True, 10.0), (False, 120.0)])
async def test_a_short_request_waits_for_one_long_one_not_twelve(
    autojump_clock, models, fair, most_wait
):
    async with scheduler(num_parallel=1, fair_share=fair) as (sched, _, _):
        await hold(sched, req(models, "a"), 0, [], "load")
        served: list[str] = []
        async with trio.open_nursery() as nursery:
            for i in range(12):
                agent = req(models, "a", principal="10.0.0.1", cost=LONG)
                nursery.start_soon(hold, sched, agent, 10, served, f"long{i}")
            await trio.sleep(0.5)
            asked = trio.current_time()
            user = req(models, "a", principal="10.0.0.2", cost=SHORT)
            async with sched.lease(user) as lease:
                served.append("short")
                waited = trio.current_time() - asked
                assert lease.waited == pytest.approx(waited)
        assert waited == pytest.approx(most_wait - 0.5, abs=0.01)
        assert served.index("short") == (1 if fair else 12)
        assert sched.waiting == 0


async def test_waiters_cancelled_leave_nothing_behind(autojump_clock, models):
    async with scheduler(num_parallel=1) as (sched, _, _):
        await hold(sched, req(models, "a"), 0, [], "load")
        runner = sched.runner(str(models["a"]))
        assert runner is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold, sched, req(models, "a", principal="x"), 10, [], "holder")
            await trio.sleep(0.1)
            with trio.move_on_after(2):
                async with trio.open_nursery() as waiters:
                    for principal in ("x", "y", "y", "z"):
                        for priority in ("interactive", "batch"):
                            request = req(
                                models, "a", principal=principal, priority=priority, cost=LONG
                            )
                            waiters.start_soon(hold, sched, request, 1, [], principal)
                    await trio.sleep(1)
                    assert runner.slots.waiting == 8
                    (info,) = sched.ps()
                    assert (info.active, info.queued) == (1, 8)
            (info,) = sched.ps()
            assert (info.active, info.queued, runner.slot_waiters, sched.waiting) == (1, 0, 0, 0)
            assert runner.slots.waiting == 0
            assert runner.slots._principals == {}
            assert not runner.slots._round
        # The slot came back to nobody waiting: kept free, and the next request takes it at
        # once (no credit left to anyone from before).
        start = trio.current_time()
        async with sched.lease(req(models, "a", principal="y")):
            assert trio.current_time() == start
        assert runner.slots.free == 1


async def test_the_queue_limit_counts_every_principals_waiters(autojump_clock, models):
    async with scheduler(num_parallel=1, max_queue=2) as (sched, _, _):
        await hold(sched, req(models, "a"), 0, [], "load")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold, sched, req(models, "a", principal="x"), 10, [], "")
            nursery.start_soon(hold, sched, req(models, "a", principal="x"), 10, [], "")
            nursery.start_soon(hold, sched, req(models, "a", principal="y"), 10, [], "")
            await trio.sleep(1)
            assert sched.waiting == 2
            with pytest.raises(QueueFullError):
                await hold(sched, req(models, "a", principal="z"), 0, [], "")
        assert sched.waiting == 0


# -- the queue itself --------------------------------------------------------------------


async def serve_in_order(queue: SlotQueue, asks: list[tuple[str, str, Any, int]]) -> list[str]:
    """Queue ``asks`` (label, principal, priority, cost) behind a held slot, in that order,
    then release the slot and record the order in which they are served."""
    assert queue.try_take()
    served: list[str] = []

    async def ask(label: str, principal: str, priority: Any, cost: int) -> None:
        await queue.take(principal, priority, cost)
        served.append(label)
        await trio.sleep(1)
        queue.release()

    async with trio.open_nursery() as nursery:
        for label, principal, priority, cost in asks:
            nursery.start_soon(ask, label, principal, priority, cost)
            await trio.lowlevel.checkpoint()
        await trio.testing.wait_all_tasks_blocked()
        assert queue.waiting == len(asks)
        queue.release()
    assert (queue.waiting, queue.free) == (0, 1)
    return served


async def test_shares_are_weighted_by_tokens_not_requests(autojump_clock):
    asks = [(f"a{i}", "a", "interactive", 1000) for i in range(4)]
    asks += [(f"b{i}", "b", "interactive", 250) for i in range(8)]
    served = await serve_in_order(SlotQueue(1), asks)
    # b's requests cost a quarter of a's: it gets about four for each of a's, and at every
    # point the tokens each was served differ by less than one request and a turn's credit.
    assert served[:4] == ["b0", "b1", "b2", "a0"]
    tokens = {"a": 0, "b": 0}
    for label in served[:-2]:  # while both still wait
        tokens[label[0]] += 1000 if label[0] == "a" else 250
        assert abs(tokens["a"] - tokens["b"]) <= 1000 + QUANTUM
    assert sorted(served) == sorted(label for label, *_ in asks)


async def test_equal_costs_alternate_between_principals(autojump_clock):
    asks = [(f"a{i}", "a", "interactive", 100) for i in range(3)]
    asks += [(f"b{i}", "b", "interactive", 100) for i in range(3)]
    served = await serve_in_order(SlotQueue(1), asks)
    assert [label[0] for label in served] in (["a", "b"] * 3, ["a", "a", "b", "b", "a", "b"])
    assert [label for label in served if label[0] == "a"] == ["a0", "a1", "a2"]


async def test_batch_waits_behind_the_same_principals_interactive(autojump_clock):
    asks = [
        ("batch0", "a", "batch", 10),
        ("batch1", "a", "batch", 10),
        ("chat0", "a", "interactive", 10),
        ("chat1", "a", "interactive", 10),
    ]
    assert await serve_in_order(SlotQueue(1), asks) == ["chat0", "chat1", "batch0", "batch1"]


async def test_first_come_first_served_without_fair_share(autojump_clock):
    asks = [(f"a{i}", "a", "batch", LONG) for i in range(3)]
    asks += [("b0", "b", "interactive", SHORT)]
    served = await serve_in_order(SlotQueue(1, fair=False), asks)
    assert served == ["a0", "a1", "a2", "b0"]


async def test_a_waiter_cancelled_as_its_slot_is_granted_passes_it_on(autojump_clock):
    queue = SlotQueue(1)
    assert queue.try_take()
    served: list[str] = []

    async def ask(label: str, scope: trio.CancelScope) -> None:
        with scope:
            await queue.take(label, "interactive", 10)
            served.append(label)
            queue.release()

    first, second = trio.CancelScope(), trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, "first", first)
        nursery.start_soon(ask, "second", second)
        await trio.testing.wait_all_tasks_blocked()
        first.cancel()  # its task is woken with Cancelled but has not run yet...
        queue.release()  # ...when the slot is granted to it: it hands the slot on
    assert served == ["second"]
    assert (queue.waiting, queue.free, queue._principals) == (0, 1, {})


# -- a real runner (SmolLM2, one slot) ---------------------------------------------------


@pytest.mark.slow
async def test_a_short_request_is_served_after_one_long_generation_on_a_real_runner(
    smollm2_path: Path,
) -> None:
    settings = replace(Settings(), num_parallel=1)
    model = ModelRequest(name="smol", model_path=str(smollm2_path), options={"num_ctx": 2048})
    order: list[str] = []
    waits: dict[str, float] = {}

    async def ask(label: str, request: ModelRequest, n: int) -> None:
        asked = trio.current_time()
        async with sched.lease(request) as lease:
            waits[label] = trio.current_time() - asked
            order.append(label)
            options: dict[str, Any] = {"num_predict": n, "temperature": 0}
            completion = CompletionRequest(prompt="Write a long story.", options=options)
            async with lease.engine.complete(completion) as chunks:
                async for _ in chunks:
                    pass

    with trio.fail_after(180):
        async with open_scheduler(
            settings, engines=ProcessEngineFactory(settings), devices=cpu_only()
        ) as sched:
            await ask("warm-up", model, 4)  # loaded, and its first generation's costs paid
            async with trio.open_nursery() as nursery:
                for i in range(4):
                    agent = replace(model, principal="127.0.0.1", cost=LONG)
                    nursery.start_soon(ask, f"long{i}", agent, 48)
                    await trio.sleep(0.01)
                await trio.sleep(0.2)
                nursery.start_soon(ask, "short", replace(model, principal="127.0.0.2"), 2)
    # Behind the one long generation that held the slot, not the three others waiting.
    assert order.index("short") == 2, order
    assert waits["short"] < waits["long1"] < waits["long3"]
