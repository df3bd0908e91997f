"""The scheduler's event stream (``sched.events``): what it says, in order, and that a slow
subscriber cannot hold the scheduler back."""

from __future__ import annotations

import pytest
import test_scheduler
import trio

from ollamatrio.engines.simulated import SimulatedBehaviour
from ollamatrio.errors import RunnerCrashedError, RunnerStartError
from ollamatrio.scheduler.events import EventHub, SchedulerEvent

models = test_scheduler.models  # the sparse GB-sized models, as a fixture here too
req, scheduler, use = test_scheduler.req, test_scheduler.scheduler, test_scheduler.use
generate = test_scheduler.generate


def kinds(events: list[SchedulerEvent]) -> list[tuple[str, str, str | None]]:
    """Kinds in order, a load's progress reports (``loading`` after the first) folded."""
    return [(e.kind, e.model, e.reason) for e in events if e.kind != "loading" or e.completed == 0]


async def test_a_models_life_from_queue_to_unload(autojump_clock, models):
    seen: list[SchedulerEvent] = []
    async with scheduler(max_loaded_models=1) as (sched, _, _):
        sched.events.add_listener(seen.append)
        await use(sched, req(models, "a", keep_alive=60.0))
        await use(sched, req(models, "b", keep_alive=60.0))  # evicts a: count
        await trio.sleep(61)  # b expires
    assert kinds(seen) == [
        ("queued", "a", None),
        ("loading", "a", None),
        ("loaded", "a", None),
        ("queued", "b", None),
        ("evicting", "a", "count"),
        ("unloaded", "a", None),
        ("loading", "b", None),
        ("loaded", "b", None),
        ("expired", "b", None),
        ("unloaded", "b", None),
    ]
    loaded = [e for e in seen if e.kind == "loaded"]
    assert loaded[0].seconds == pytest.approx(1.0, abs=0.01)
    assert seen[0].queued == 1


async def test_unload_request_and_failed_loads_say_why(autojump_clock, models):
    seen: list[SchedulerEvent] = []
    behaviours = {
        "b": SimulatedBehaviour(fail_load="oom"),
        "c": SimulatedBehaviour(fail_load="error"),
    }
    async with scheduler(behaviours=behaviours) as (sched, _, _):
        sched.events.add_listener(seen.append)
        await use(sched, req(models, "a"))
        assert sched.unload(str(models["a"]))
        await trio.sleep(0.001)
        with pytest.raises(RunnerStartError):
            await use(sched, req(models, "c"))
    assert ("evicting", "a", "request") in kinds(seen)
    assert ("load_failed", "c", "error") in kinds(seen)


async def test_a_crash_is_reported(autojump_clock, models):
    seen: list[SchedulerEvent] = []
    behaviours = {"a": SimulatedBehaviour(crash_after_tokens=2)}
    async with scheduler(behaviours=behaviours) as (sched, _, _):
        sched.events.add_listener(seen.append)
        with pytest.raises(RunnerCrashedError):
            await generate(sched, req(models, "a"))
        await trio.sleep(0.001)
    assert [k for k, _, _ in kinds(seen)][-2:] == ["crashed", "unloaded"]


async def test_subscribers_get_events_and_a_laggard_is_cut_off():
    hub = EventHub()
    async with hub.subscribe() as fast, hub.subscribe(buffer=2) as slow:
        for i in range(3):
            hub.publish(SchedulerEvent("queued", f"m{i}", f"k{i}"))
        assert [fast.receive_nowait().model for _ in range(3)] == ["m0", "m1", "m2"]
        assert [e.model async for e in slow] == ["m0", "m1"]  # then the channel ends
        assert hub.subscribers == 1
    assert hub.subscribers == 0


async def test_a_failing_listener_does_not_break_publishing(caplog):
    hub = EventHub()
    got: list[str] = []

    def broken(event: SchedulerEvent) -> None:
        raise RuntimeError("bug")

    hub.add_listener(broken)
    hub.add_listener(lambda e: got.append(e.model))
    hub.publish(SchedulerEvent("loaded", "m", "k", seconds=1.5))
    assert got == ["m"]
    assert "listener failed" in caplog.text
    assert SchedulerEvent("loaded", "m", "k", seconds=1.5, at=1.0).as_json() == {
        "event": "loaded", "model": "m", "at": 1.0, "seconds": 1.5,
    }  # fmt: skip
