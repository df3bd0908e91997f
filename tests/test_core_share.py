"""The scheduler dividing the cores among runners as they start, generate, idle and stop
(scheduler/core_share.py), on the simulated engine in virtual time; and the reading of the
cores other processes keep busy (devices/cpu_load.py) on a /proc tree of the test's own."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from ollamatrio.config import Settings
from ollamatrio.devices import SimulatedDevices
from ollamatrio.devices.cpu_load import CpuElsewhere
from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngine, SimulatedEngineFactory
from ollamatrio.model_info import read_cached
from ollamatrio.scheduler import ModelRequest, Scheduler, open_scheduler
from ollamatrio.testing import write_tiny_gguf

GiB = 1 << 30


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("core-models")
    paths = {name: write_tiny_gguf(root / f"{name}.gguf", name=name) for name in ("a", "b", "c")}
    for path in paths.values():
        read_cached(str(path))  # no thread hop (and clock jump) reading headers in a test
    return paths


class FixedElsewhere(CpuElsewhere):
    """Other processes keeping ``busy`` cores busy, whatever /proc says."""

    def __init__(self, cores: int, busy: float) -> None:
        super().__init__(cores)
        self.busy = busy
        self.readings = 0

    def since_last(self, pids: Iterable[int], *, at_least: float) -> float | None:
        self.readings += 1
        return self.busy


@asynccontextmanager
async def scheduler(
    cores: int, elsewhere: CpuElsewhere | None = None, **settings: Any
) -> AsyncIterator[Scheduler]:
    devices = SimulatedDevices(json.dumps({"gpus": [], "system": {"total": 64 * GiB}}))
    engines = SimulatedEngineFactory(devices, default=SimulatedBehaviour(load_seconds=1.0))
    config = replace(Settings(), cores=cores, max_loaded_models=3, **settings)
    async with open_scheduler(
        config, engines=engines, devices=devices, cpu_elsewhere=elsewhere
    ) as s:
        yield s


def req(models: dict[str, Path], name: str, **options: Any) -> ModelRequest:
    return ModelRequest(name=name, model_path=str(models[name]), options=options)


def threads(sched: Scheduler) -> dict[str, int]:
    return {info.name: info.threads for info in sched.ps()}


def engine_of(sched: Scheduler, name: str) -> SimulatedEngine:
    (runner,) = [r for r in sched.runners() if r.name == name]
    assert isinstance(runner.engine, SimulatedEngine)
    return runner.engine


async def settle() -> None:
    await trio.sleep(0.001)  # virtual time: every task that can run has run


async def test_runners_divide_the_cores_while_they_generate_and_take_them_back(
    autojump_clock, models
):
    async with scheduler(cores=4) as sched:
        await sched.load(req(models, "a"))
        await sched.load(req(models, "b"))
        await settle()
        assert threads(sched) == {"a": 4, "b": 4}  # nothing generates: all, to whoever starts
        async with sched.lease(req(models, "a")):
            await settle()
            assert threads(sched) == {"a": 4, "b": 2}  # b would get half if it started
            async with sched.lease(req(models, "b")):
                await settle()
                assert threads(sched) == {"a": 2, "b": 2}
            await settle()
            assert threads(sched) == {"a": 4, "b": 2}
        await settle()
        assert threads(sched) == {"a": 4, "b": 4}
        assert engine_of(sched, "a").thread_changes == [2, 4]
        assert engine_of(sched, "b").thread_changes == [2, 4]


async def test_three_runners_on_two_cores_get_one_thread_each(autojump_clock, models):
    async with scheduler(cores=2) as sched:
        for name in "abc":
            await sched.load(req(models, name))
        async with trio.open_nursery() as nursery:
            held = trio.Event()
            for name in "abc":
                nursery.start_soon(hold, sched, req(models, name), held)
            await settle()
            assert threads(sched) == {"a": 1, "b": 1, "c": 1}
            held.set()


async def hold(sched: Scheduler, request: ModelRequest, until: trio.Event) -> None:
    async with sched.lease(request):
        await until.wait()


async def test_a_runner_that_stops_leaves_its_cores_to_the_others(autojump_clock, models):
    async with scheduler(cores=4) as sched:
        await sched.load(req(models, "a"))
        async with sched.lease(req(models, "b")):
            await settle()
            assert threads(sched) == {"a": 2, "b": 4}
            assert await sched.stop(str(models["a"]))
            async with sched.lease(req(models, "c")):
                await settle()
                assert threads(sched) == {"b": 2, "c": 2}


async def test_an_explicit_num_thread_is_obeyed_and_taken_off_the_cores(autojump_clock, models):
    async with scheduler(cores=4) as sched:
        async with sched.lease(req(models, "a", num_thread=3)):
            async with sched.lease(req(models, "b")):
                await settle()
                assert threads(sched) == {"a": 3, "b": 1}
        assert engine_of(sched, "a").thread_pool == 0
        assert engine_of(sched, "a").thread_changes == []


async def test_cores_busy_elsewhere_are_left_to_their_processes(autojump_clock, models):
    elsewhere = FixedElsewhere(4, busy=1.1)
    async with scheduler(cores=4, elsewhere=elsewhere) as sched:
        await sched.load(req(models, "a"))
        async with sched.lease(req(models, "a")):
            await settle()
            assert threads(sched) == {"a": 4}  # nothing read yet
            await trio.sleep(1.5)  # one reading a second while it generates
            assert threads(sched) == {"a": 3}
            elsewhere.busy = 0.2
            await trio.sleep(1.0)
            assert threads(sched) == {"a": 4}
        await settle()
        readings = elsewhere.readings
        await trio.sleep(60)
        assert elsewhere.readings == readings  # not read while nothing generates


async def test_cores_busy_elsewhere_never_leave_a_runner_without_a_thread(autojump_clock, models):
    async with scheduler(cores=2, elsewhere=FixedElsewhere(2, busy=5.0)) as sched:
        async with sched.lease(req(models, "a")):
            await trio.sleep(2.5)
            assert threads(sched) == {"a": 1}


# -- reading the cores busy elsewhere ------------------------------------------------------


def write_proc(root: Path, cpus: dict[int, int], pids: dict[int, int]) -> None:
    """A /proc with each CPU's busy ticks (user) and each process's utime."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{n} {busy} 0 0 1000 7 0 0 0 0 0" for n, busy in cpus.items()]
    (root / "stat").write_text("\n".join(lines) + "\n")
    for pid, ticks in pids.items():
        (root / str(pid)).mkdir(exist_ok=True)
        rest = " ".join(["S"] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 30)
        (root / str(pid) / "stat").write_text(f"{pid} (python (x)) {rest}\n")


def test_busy_cores_elsewhere_are_the_cpus_time_less_the_servers_and_runners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cpus = sorted(os.sched_getaffinity(0))
    runner = 999_999
    me = os.getpid()
    clock = iter([100.0, 102.0])
    monkeypatch.setattr("ollamatrio.devices.cpu_load.time.monotonic", lambda: next(clock))
    ticks = os.sysconf("SC_CLK_TCK")
    write_proc(tmp_path, {n: 0 for n in cpus}, {me: 0, runner: 0})
    reader = CpuElsewhere(len(cpus), proc=tmp_path)
    assert reader.since_last([runner], at_least=1.0) is None  # nothing to compare with yet
    # Two seconds later: the runner used 1.5 s of CPU, the server 0.1 s, and the CPUs were
    # busy 3.6 s in all: 2.0 s elsewhere, one core's worth.
    first = cpus[0]
    write_proc(
        tmp_path,
        {n: (round(3.6 * ticks) if n == first else 0) for n in cpus},
        {me: round(0.1 * ticks), runner: round(1.5 * ticks)},
    )
    assert reader.since_last([runner], at_least=1.0) == pytest.approx(1.0, abs=0.05)
