"""Load progress: engines report bytes read, the scheduler publishes them as ``loading``
events (virtual time, the simulated engine; and one real runner on a generated GGUF)."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_scheduler
import trio

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.engines.simulated import LOAD_STEPS, SimulatedBehaviour
from ollamatrio.errors import RunnerStartError
from ollamatrio.scheduler.events import SchedulerEvent
from ollamatrio.types import LoadSpec

models = test_scheduler.models
req, scheduler, use = test_scheduler.req, test_scheduler.scheduler, test_scheduler.use


def progress(events: list[SchedulerEvent], model: str) -> list[tuple[int | None, int | None]]:
    return [(e.completed, e.total) for e in events if e.kind == "loading" and e.model == model]


async def test_a_load_reports_bytes_in_steps_as_virtual_time_passes(autojump_clock, models):
    seen: list[tuple[float, SchedulerEvent]] = []
    async with scheduler() as (sched, _, _):
        sched.events.add_listener(lambda e: seen.append((trio.current_time(), e)))
        start = trio.current_time()
        await use(sched, req(models, "a"))
    total = models["a"].stat().st_size
    loading = [(t - start, e) for t, e in seen if e.kind == "loading"]
    assert [e.completed for _, e in loading] == [
        total * step // LOAD_STEPS for step in range(LOAD_STEPS + 1)
    ]
    assert {e.total for _, e in loading} == {total}
    # Spread over the load's second, each before ``loaded``.
    assert [round(t, 3) for t, _ in loading] == [step / LOAD_STEPS for step in range(11)]
    kinds = [e.kind for _, e in seen]
    assert kinds.index("loaded") > kinds.index("loading") + LOAD_STEPS


async def test_subscribers_see_progress_and_late_requests_read_it(autojump_clock, models):
    async with scheduler() as (sched, _, _), sched.events.subscribe() as events:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"))
            await trio.sleep(0.55)
            runner = sched.runner(str(models["a"]))
            assert runner is not None
            total = models["a"].stat().st_size
            assert runner.load_progress == (total * 5 // LOAD_STEPS, total)
            assert sched.load_needed(req(models, "a"))
        assert not sched.load_needed(req(models, "a"))
        assert sched.load_needed(req(models, "b"))
        got = []
        while (event := events.receive_nowait()).kind != "loaded":
            got.append(event)
    assert progress(got, "a")[-1] == (total, total)


async def test_a_failed_load_stops_reporting_halfway(autojump_clock, models):
    seen: list[SchedulerEvent] = []
    async with scheduler(behaviours={"a": SimulatedBehaviour(fail_load="error")}) as (sched, _, _):
        sched.events.add_listener(seen.append)
        with pytest.raises(RunnerStartError):
            await use(sched, req(models, "a"))
    total = models["a"].stat().st_size
    assert progress(seen, "a")[-1] == (total // 2, total)
    assert [e.kind for e in seen][-2:] == ["load_failed", "unloaded"]


async def test_a_real_runner_reports_bytes_read_up_to_the_file_size(tmp_path: Path):
    """The process engine reads the runner's file offset from /proc while it loads; a model
    of a few hundred MB (sparse, so no disk) takes long enough to be seen part-way."""
    from ollamatrio.testing import write_tiny_gguf

    path = write_tiny_gguf(
        tmp_path / "m.gguf", layers=8, embd=1024, ff=4096, vocab=32000, sparse=True
    )
    total = path.stat().st_size
    seen: list[tuple[int, int]] = []
    with trio.fail_after(120):
        factory = ProcessEngineFactory(load_timeout=120)
        spec = LoadSpec(model_path=str(path), name="m", num_ctx=256, use_mmap=False)
        async with factory.open(spec, progress=lambda c, t: seen.append((c, t))):
            pass
    assert seen[0] == (0, total)
    assert seen[-1] == (total, total)
    completed = [c for c, _ in seen]
    assert completed == sorted(completed)
    assert {t for _, t in seen} == {total}
    assert any(0 < c < total for c in completed), seen  # real progress in between


def test_the_resident_part_of_a_mapped_model_counts_as_read(tmp_path: Path):
    """A GPU load maps the model and copies tensors out of the mapping: the file offset
    stays put, the mapping's resident pages grow."""
    import mmap
    import os

    from ollamatrio.engines.load_watch import FileOffset, mapped_bytes

    page = mmap.PAGESIZE
    path = tmp_path / "m.gguf"
    path.write_bytes(b"\1" * (64 * page))
    real = os.path.realpath(path)
    assert mapped_bytes(os.getpid(), real) is None  # not mapped yet
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        untouched = mapped_bytes(os.getpid(), real)
        assert untouched is not None
        assert untouched < 16 * page
        total = sum(m[i * page] for i in range(32))  # fault in half of the pages
        assert total == 32
        touched = mapped_bytes(os.getpid(), real)
        assert touched is not None
        assert 32 * page <= touched <= 64 * page
        assert FileOffset(os.getpid(), str(path)).read() == touched
