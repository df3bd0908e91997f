"""Scheduler benchmarks on the simulated engine.

    python scripts/bench_scheduler.py [--cycles 50000] [--queued 1000] [--models 50]

1. Lease + release cycles per second on one loaded runner (real clock; target ≥ 20,000/s).
2. Time to a scheduling decision: wall time of each placement pass while ``--queued``
   requests over ``--models`` models wait (p50/p99), and the time from a request's arrival
   to the moment it was given a runner to wait for.
3. Head-of-line check: latency of a request to loaded model B while model A takes 30 s
   (simulated) to load, against B alone (target ratio ≤ 1.2).  Runs on a virtual clock, so
   a 30 s load costs no wall time; latencies are in virtual seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import trio
import trio.testing

from ollamatrio.config import Settings
from ollamatrio.devices import SimulatedDevices
from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngineFactory
from ollamatrio.model_info import read_cached
from ollamatrio.scheduler import ModelRequest, open_scheduler
from ollamatrio.testing import write_tiny_gguf
from ollamatrio.types import CompletionRequest

GiB = 1 << 30


def make_models(root: Path, n: int) -> list[Path]:
    paths = []
    for i in range(n):
        path = write_tiny_gguf(
            root / f"m{i}.gguf", layers=4, embd=2048, heads=16, kv_heads=4, ff=5632,
            vocab=32000, ctx=4096, dtype="q8_0", sparse=True, name=f"m{i}",
        )  # fmt: skip
        read_cached(str(path))
        paths.append(path)
    return paths


def scheduler_for(paths_total: int, default: SimulatedBehaviour, **settings: object):
    devices = SimulatedDevices(
        json.dumps(
            {
                "gpus": [{"id": "sim0", "total": "24GiB"}, {"id": "sim1", "total": "24GiB"}],
                "system": {"total": "64GiB", "cpu_count": 2},
            }
        )
    )
    engines = SimulatedEngineFactory(devices, default=default)
    return open_scheduler(replace(Settings(), **settings), engines=engines, devices=devices)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def bench_cycles(path: Path, cycles: int) -> float:
    request = ModelRequest(name="m0", model_path=str(path))
    async with scheduler_for(1, SimulatedBehaviour(load_seconds=0.0)) as sched:
        await sched.load(request)
        start = time.perf_counter()
        for _ in range(cycles):
            async with sched.lease(request):
                pass
        return cycles / (time.perf_counter() - start)


async def bench_decisions(paths: list[Path], queued: int) -> dict[str, float]:
    waits: list[float] = []
    behaviour = SimulatedBehaviour(load_seconds=0.5, tokens_per_second=2000)
    async with scheduler_for(
        len(paths), behaviour, max_queue=queued * 2, max_loaded_models=8, keep_alive=0.0
    ) as sched:

        async def one(i: int) -> None:
            path = paths[i % len(paths)]
            request = ModelRequest(name=path.stem, model_path=str(path))
            arrived = time.perf_counter()
            async with sched.lease(request) as lease:
                waits.append(time.perf_counter() - arrived)
                async with lease.engine.complete(CompletionRequest(prompt="hi")) as chunks:
                    async for _ in chunks:
                        pass

        async with trio.open_nursery() as nursery:
            for i in range(queued):
                nursery.start_soon(one, i)
        passes = list(sched.pass_seconds)
    return {
        "passes": len(passes),
        "pass_p50_ms": pct(passes, 0.5) * 1e3,
        "pass_p99_ms": pct(passes, 0.99) * 1e3,
        "pass_max_ms": max(passes) * 1e3,
    }


async def bench_head_of_line(paths: list[Path]) -> tuple[float, float]:
    a = ModelRequest(name="A", model_path=str(paths[0]))
    b = ModelRequest(name="B", model_path=str(paths[1]))
    behaviour = SimulatedBehaviour(load_seconds=1.0, tokens_per_second=1000)

    async def b_latency(sched) -> float:
        start = trio.current_time()
        async with sched.lease(b) as lease:
            async with lease.engine.complete(
                CompletionRequest(prompt="hello", options={"num_predict": 16})
            ) as chunks:
                async for _ in chunks:
                    pass
        return trio.current_time() - start

    async with scheduler_for(2, behaviour) as sched:
        await sched.load(b)
        alone = statistics.median([await b_latency(sched) for _ in range(5)])
    async with scheduler_for(2, behaviour) as sched:
        sched._engines.models["A"] = SimulatedBehaviour(load_seconds=30.0)
        await sched.load(b)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sched.load, a)
            await trio.sleep(1.0)  # A is loading now, for 29 more seconds
            during = statistics.median([await b_latency(sched) for _ in range(5)])
    return alone, during


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=50_000)
    ap.add_argument("--queued", type=int, default=1000)
    ap.add_argument("--models", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_models(Path(tmp), args.models)
        rate = trio.run(bench_cycles, paths[0], args.cycles)
        decisions = trio.run(bench_decisions, paths, args.queued)
        alone, during = trio.run(
            bench_head_of_line, paths, clock=trio.testing.MockClock(autojump_threshold=0)
        )
    rows = [
        ("lease+release cycles/s (loaded runner)", f"{rate:,.0f}", "≥ 20,000"),
        (
            f"placement pass, {args.queued} requests over {args.models} models: p50",
            f"{decisions['pass_p50_ms']:.3f} ms",
            "",
        ),
        ("placement pass: p99", f"{decisions['pass_p99_ms']:.3f} ms", ""),
        ("placement pass: max", f"{decisions['pass_max_ms']:.3f} ms", ""),
        ("placement passes run", f"{decisions['passes']:.0f}", ""),
        ("B latency alone (virtual s)", f"{alone:.4f}", ""),
        ("B latency while A loads 30 s (virtual s)", f"{during:.4f}", ""),
        ("head-of-line ratio", f"{during / alone:.3f}", "≤ 1.2"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>14}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>14}  {target}")
    sys.exit(0)


if __name__ == "__main__":
    main()
