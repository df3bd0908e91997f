#!/usr/bin/env python3
"""Predicted against measured VRAM, eviction by memory and decode speed on an NVIDIA GPU.

Three sections, each through the real scheduler (``open_scheduler`` with NVML and runner
processes), on sparse generated models of 1B, 8B and 70B class (all-zero weights, no disk):

1. **memory**: per case (model, context per slot, slots, full or partial offload) the VRAM
   the scheduler predicted and booked for the runner (``memory.estimate`` + placement, its
   GPU context reserve included, correction factor 1.0 on a fresh scheduler) against what
   NVML reports for the runner process when it is ready and after one prompt of
   ``n_ubatch`` + 88 tokens; and the correction factor the scheduler learnt from it.
2. **eviction**: ``OLLAMA_GPU_OVERHEAD`` shrinks the usable VRAM to 1.5 times one 8B model;
   after loading model A, a request for model B must evict A (by memory, not by count).
3. **speed**: TTFT and decode tokens/s through ``/api/generate`` (``ollamatrio.serve`` on
   127.0.0.1:0, keep-alive httpx clients) against xllamacpp in-process (a child process
   with the very llama.cpp parameters a runner uses), at 1, 4 and 8 concurrent streams, on
   a 1B-class F16 model with random weights (greedy, EOS ignored, exactly --tokens tokens).

Usage:
    python scripts/bench_gpu.py [--quick] [--sections memory,eviction,speed] [--reps 3]
        [--tokens 128] [--workdir DIR] [--append docs/benchmarks.md]
    python scripts/bench_gpu.py --dry-run [--gpu-total 80GiB]

Exit status: 0 after a run; 2, with one line on stderr, when this machine has no NVIDIA GPU
or the installed xllamacpp is not a CUDA build (nothing was measured).  ``--dry-run`` needs
neither: it runs the memory and eviction sections against a simulated GPU of --gpu-total
(predicted column only) and the speed section on whatever this machine has (the CPU, here)
with a tiny model, to check the plumbing.  Generated models live in --workdir (default: a
temporary directory, deleted afterwards); the random-weight speed model takes ~15 s per GB
to write, so keep a --workdir between runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import trio  # noqa: E402
from bench_api import Run  # noqa: E402
from bench_memory import PROMPT_EXTRA, TOKEN_ID, cpu_name  # noqa: E402
from bench_runner import _timed_in_process  # noqa: E402
from bench_runner import options as greedy_options  # noqa: E402

from ollamatrio.config import Settings  # noqa: E402
from ollamatrio.devices import NvmlDevices, SimulatedDevices, parse_size  # noqa: E402
from ollamatrio.engines.capability import EngineProbeError, probe_engine  # noqa: E402
from ollamatrio.engines.process import ProcessEngineFactory  # noqa: E402
from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngineFactory  # noqa: E402
from ollamatrio.gguf import read_gguf  # noqa: E402
from ollamatrio.memory import MemoryOptions, estimate, gpu_context_reserve  # noqa: E402
from ollamatrio.runner.visibility import visible_devices_env  # noqa: E402
from ollamatrio.scheduler import ModelRequest, open_scheduler  # noqa: E402
from ollamatrio.scheduler.placement import DeviceRoom, choose_placement  # noqa: E402
from ollamatrio.serve import serve  # noqa: E402
from ollamatrio.store import (  # noqa: E402
    ModelStore,
    import_gguf,
)
from ollamatrio.testing import write_tiny_gguf  # noqa: E402
from ollamatrio.types import LoadSpec  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
LOAD_TIMEOUT = 600.0
NOTHING_MEASURED = 2  # exit status without a GPU or a CUDA engine
STREAMS = (1, 4, 8)
SPEED_CTX = 2048  # per slot
PROMPT = "Once upon a time, in a small village by the sea, there lived"

# Llama-shaped models of the three classes; a 32 000-token vocabulary keeps them quick to write.
MODELS: dict[str, dict[str, Any]] = {
    "1B F16": dict(layers=16, embd=2048, heads=32, kv_heads=8, ff=8192, dtype="f16"),
    "8B Q4_0": dict(layers=32, embd=4096, heads=32, kv_heads=8, ff=14336, dtype="q4_0"),
    "70B Q4_0": dict(layers=80, embd=8192, heads=64, kv_heads=8, ff=28672, dtype="q4_0"),
}
COMMON = dict(vocab=32000, ctx=32768)


@dataclass(frozen=True)
class Case:
    model: str  # a key of MODELS
    num_ctx: int  # per slot
    slots: int = 1
    num_gpu: int | None = None  # layers to offload; None: as many as fit (all, here)


CASES = (
    Case("1B F16", 4096),
    Case("1B F16", 8192),
    Case("1B F16", 2048, 4),
    Case("1B F16", 8192, 4),
    Case("8B Q4_0", 8192),
    Case("8B Q4_0", 4096, 4),
    Case("8B Q4_0", 8192, num_gpu=16),
    Case("70B Q4_0", 8192),
    Case("70B Q4_0", 4096, num_gpu=40),
)
QUICK = (CASES[0], CASES[4], CASES[6])


# -- where the models go: the real GPU, or a simulated one (--dry-run) ------------------------


@dataclass
class Target:
    real: bool
    gpu_id: str
    gpu_name: str
    gpu_total: int
    driver: str = ""
    engine: str = ""

    def open(self, settings: Settings) -> tuple[Any, Any]:
        """A fresh device source and engine factory (a fresh simulation for --dry-run)."""
        if self.real:
            return NvmlDevices(), ProcessEngineFactory(settings)
        spec = {
            "gpus": [{"id": self.gpu_id, "name": self.gpu_name, "total": self.gpu_total}],
            "system": {"total": "512GiB"},
        }
        devices = SimulatedDevices(json.dumps(spec))
        behaviour = SimulatedBehaviour(load_seconds=0.0, tokens_per_second=1000)
        return devices, SimulatedEngineFactory(devices, default=behaviour)


async def real_target() -> Target | str:
    """The first visible NVIDIA GPU, or why there is none to measure."""
    inventory = await NvmlDevices().inventory()
    if not inventory.gpus:
        return "no NVIDIA GPU (NVML lists none)"
    try:
        report = await probe_engine()
    except EngineProbeError as exc:
        return f"cannot ask the engine which devices it can use: {exc}"
    if not report.gpus("CUDA"):
        return f"the installed xllamacpp is not a CUDA build ({report.describe()})"
    gpu = inventory.gpus[0]
    if len(inventory.gpus) > 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu.id  # one GPU: every case lands on it
    driver = ".".join(map(str, gpu.driver))
    return Target(True, gpu.id, gpu.name, gpu.total, f"CUDA driver {driver}", report.describe())


def write_models(workdir: Path, names: set[str]) -> dict[str, Path]:
    paths = {}
    for name in sorted(names):
        path = workdir / (name.replace(" ", "_") + ".gguf")
        if not path.exists():
            write_tiny_gguf(path, sparse=True, name=name, **MODELS[name], **COMMON)
        paths[name] = path
    return paths


def _settings(**changes: Any) -> Settings:
    return replace(Settings(), load_timeout=LOAD_TIMEOUT, **changes)


# -- 1. memory ---------------------------------------------------------------------------------


@dataclass
class MemoryRow:
    case: Case
    weights: int
    layers: str  # "17/17"
    predicted: int  # VRAM booked on the GPU, reserve included
    reserve: int
    at_ready: int | None = None
    after_prompt: int | None = None
    factor: float = 1.0

    @property
    def error(self) -> float | None:
        if not self.after_prompt:
            return None
        return (self.predicted - self.after_prompt) / self.after_prompt * 100


async def memory_case(target: Target, case: Case, path: Path) -> MemoryRow:
    settings = _settings(num_parallel=case.slots, keep_alive=0.0)
    devices, engines = target.open(settings)
    options: dict[str, Any] = {"num_ctx": case.num_ctx}
    if case.num_gpu is not None:
        options["num_gpu"] = case.num_gpu
    request = ModelRequest(name=case.model, model_path=str(path), options=options, keep_alive=0)
    async with open_scheduler(settings, engines=engines, devices=devices) as sched:
        async with sched.lease(request) as lease:
            placement = lease.runner.placement
            blocks = read_gguf(path).block_count
            row = MemoryRow(
                case=case,
                weights=estimate(read_gguf(path), MemoryOptions(num_ctx=case.num_ctx)).weights,
                layers=f"{placement.num_gpu}/{blocks + 1}",
                predicted=placement.vram_by_gpu.get(target.gpu_id, 0),
                reserve=placement.reserve_by_gpu.get(target.gpu_id, 0),
            )
            if target.real:
                engine = lease.engine
                row.at_ready = engine.memory.vram_by_gpu.get(target.gpu_id, 0)
                n_prompt = min(engine.ready.plan.n_ubatch + PROMPT_EXTRA, case.num_ctx - 8)
                body = {"prompt": [TOKEN_ID] * n_prompt, "n_predict": 1, "cache_prompt": False}
                status, answer = await engine.http.request(
                    "POST", "/completion", json.dumps(body).encode()
                )
                if status != 200:
                    raise RuntimeError(f"prompt failed: HTTP {status}: {answer[:200]!r}")
                used = await devices.vram_used_by_pid(engine.pid)
                row.after_prompt = used.get(target.gpu_id, 0)
        row.factor = sched.calibration.factor(target.gpu_id)
    return row


MEMORY_HEADER = (
    "| model | weights GiB | ctx/slot | slots | layers on GPU | predicted MiB (reserve) "
    "| NVML at ready MiB | NVML after prompt MiB | error | factor learnt |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def memory_line(r: MemoryRow) -> str:
    def mib(value: int | None) -> str:
        return "—" if value is None else f"{value / MiB:.0f}"

    error = "—" if r.error is None else f"{r.error:+.1f} %"
    return (
        f"| {r.case.model} | {r.weights / GiB:.2f} | {r.case.num_ctx} | {r.case.slots} "
        f"| {r.layers} | {r.predicted / MiB:.0f} ({r.reserve / MiB:.0f}) | {mib(r.at_ready)} "
        f"| {mib(r.after_prompt)} | {error} | {r.factor:.3f} |"
    )


# -- 2. eviction by memory ---------------------------------------------------------------------


@dataclass
class EvictionResult:
    free: int
    overhead: int
    predicted: int
    loaded_after: list[str]
    load_b: float
    free_after: int | None


def predicted_vram(path: Path, gpu_id: str, free: int, num_ctx: int) -> int:
    """What the scheduler books for ``path`` alone on an empty GPU (same functions)."""
    est = estimate(read_gguf(path), MemoryOptions(num_ctx=num_ctx, flash_attention=None))
    room = DeviceRoom(gpu_id, "CUDA", free, reserve=gpu_context_reserve("CUDA"))
    placement = choose_placement(est, [room], host_free=1 << 50)
    if placement is None or not placement.fits_fully:
        raise SystemExit(f"bench_gpu: one {path.name} does not fit on the GPU")
    return placement.vram_by_gpu[gpu_id]


async def eviction(target: Target, path_a: Path, path_b: Path) -> EvictionResult:
    devices, _ = target.open(_settings())
    free = (await devices.inventory()).gpus[0].free
    predicted = predicted_vram(path_a, target.gpu_id, free, 8192)
    overhead = max(0, free - predicted * 3 // 2)  # room for one model, not two
    settings = _settings(gpu_overhead=overhead, keep_alive=math.inf, max_loaded_models=3)
    devices, engines = target.open(settings)
    options = {"num_ctx": 8192}
    async with open_scheduler(settings, engines=engines, devices=devices) as sched:
        async with sched.lease(ModelRequest("A", str(path_a), options)):
            pass
        async with sched.lease(ModelRequest("B", str(path_b), options)) as lease:
            load_b = lease.load_duration
            loaded = sorted(info.name for info in sched.ps())
            free_after = (await devices.inventory()).gpus[0].free if target.real else None
    return EvictionResult(free, overhead, predicted, loaded, load_b, free_after)


def eviction_table(e: EvictionResult) -> str:
    after = "—" if e.free_after is None else f"{e.free_after / GiB:.2f}"
    return "\n".join(
        [
            "| free GiB | OLLAMA_GPU_OVERHEAD GiB | usable GiB | predicted per model GiB "
            "| loaded after B | A evicted | B load s | NVML free after B GiB |",
            "|---|---|---|---|---|---|---|---|",
            f"| {e.free / GiB:.2f} | {e.overhead / GiB:.2f} | {(e.free - e.overhead) / GiB:.2f} "
            f"| {e.predicted / GiB:.2f} | {', '.join(e.loaded_after)} "
            f"| {'yes' if e.loaded_after == ['B'] else 'NO'} | {e.load_b:.2f} | {after} |",
        ]
    )


# -- 3. speed: /api/generate against xllamacpp in-process ---------------------------------------


async def via_api(client: httpx.AsyncClient, tokens: int, n: int) -> Run:
    """One stream, as ``bench_api.via_api`` but counting ``eval_count``: random weights
    yield byte tokens that llama.cpp joins into fewer text pieces than tokens."""
    body = {
        "model": "speed",
        "prompt": f"{PROMPT} {n}",
        "raw": True,
        "options": greedy_options(tokens),
    }
    start = time.perf_counter()
    first = last = 0.0
    count = 0
    async with client.stream("POST", "/api/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            obj = json.loads(line)
            now = time.perf_counter()
            if obj.get("response"):
                first, last = first or now, now
            if obj.get("done"):
                count = int(obj["eval_count"])
                first, last = first or now, last or now
    return Run(first - start, count, first, last)


async def streams_at_once(run: Callable[[int], Awaitable[Run]], streams: int) -> dict[str, float]:
    runs: list[Run] = []

    async def one(n: int) -> None:
        runs.append(await run(n))

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for n in range(streams):
            nursery.start_soon(one, n)
    wall = time.perf_counter() - start
    tokens = sum(r.tokens for r in runs)
    return summary([r.ttft for r in runs], [r.decode_tps for r in runs], tokens, wall)


def summary(ttfts: list[float], rates: list[float], tokens: int, wall: float) -> dict[str, float]:
    """Medians over the streams of one round, and its aggregate rate."""
    return {
        "ttft": statistics.median(ttfts),
        "decode_tps": statistics.median(rates),
        "aggregate_tps": tokens / wall,
    }


async def speed_api(model: Path, workdir: Path, tokens: int, reps: int) -> dict[int, list[dict]]:
    """Through the production entry point: ``serve`` picks devices and engine itself."""
    settings = _settings(
        host="127.0.0.1",
        port=0,
        models_dir=workdir / "store",
        num_parallel=max(STREAMS),
        context_length=SPEED_CTX,
        keep_alive=math.inf,
    )
    store = ModelStore(settings.models_dir)
    for _ in import_gguf(store, "speed", model):
        pass
    results: dict[int, list[dict]] = {n: [] for n in STREAMS}
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        (url,) = await nursery.start(partial(serve, settings, shutdown_trigger=stop.wait))
        limits = httpx.Limits(max_keepalive_connections=max(STREAMS))
        async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
            await via_api(client, tokens, 0)  # load, warm up
            for _ in range(reps):
                for streams in STREAMS:
                    run = partial(via_api, client, tokens)
                    results[streams].append(await streams_at_once(run, streams))
            ps = (await client.get("/api/ps")).json()["models"]
        stop.set()
    print(f"  /api/ps during the speed runs: {ps}", file=sys.stderr)
    return results


def speed_in_process_child(args: argparse.Namespace) -> None:
    """``--in-process``: load like a runner does, in this (main) thread, then time streams."""
    gpu_ids = (args.gpu_id,) if args.gpu_id else ()
    spec = LoadSpec(
        model_path=str(args.in_process),
        name="speed",
        num_ctx=SPEED_CTX,
        num_parallel=max(STREAMS),
        num_gpu=999 if gpu_ids else 0,
        gpu_ids=gpu_ids,
    )
    import psutil
    import xllamacpp

    from ollamatrio.engines.llamacpp_wire import sampling_fields
    from ollamatrio.runner.__main__ import _gpu_facts, _model_facts
    from ollamatrio.runner.llama import build_params
    from ollamatrio.runner.options import RunnerConfig, plan_load

    config = RunnerConfig(spec=spec, api_key="bench", socket_dir=tempfile.mkdtemp())
    plan = plan_load(
        spec,
        _model_facts(spec.model_path),
        gpus=_gpu_facts(config),
        free_ram=psutil.virtual_memory().available,
    )
    server = xllamacpp.Server(build_params(config, plan))

    def body(n: int) -> dict[str, Any]:
        return {
            **sampling_fields(greedy_options(args.tokens), SPEED_CTX),
            "prompt": f"{PROMPT} {n}",
        }

    _timed_in_process(server, body(0), args.tokens)  # warm up
    results: dict[int, list[dict]] = {n: [] for n in STREAMS}
    for _ in range(args.reps):
        for streams in STREAMS:
            runs: list[dict[str, float]] = []

            def one(n: int, runs: list[dict[str, float]] = runs) -> None:
                runs.append(_timed_in_process(server, body(n), args.tokens))

            threads = [threading.Thread(target=one, args=(n,)) for n in range(streams)]
            start = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - start
            ttfts, rates = [r["ttft"] for r in runs], [r["decode_tps"] for r in runs]
            results[streams].append(summary(ttfts, rates, args.tokens * streams, wall))
    sys.stdout.write(json.dumps({"results": results, "n_gpu_layers": plan.n_gpu_layers}) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip llama.cpp's teardown (it can hang)


def speed_in_process(model: Path, gpu_id: str, tokens: int, reps: int) -> dict[int, list[dict]]:
    # The CUDA build of xllamacpp crashes (SIGSEGV) when it is imported after numpy (which
    # this script imports through gguf): the child imports it first, as a runner does, with
    # the devices already chosen in its environment.
    bootstrap = (
        "import os, sys, runpy, xllamacpp; sys.argv = sys.argv[1:]; "
        "sys.path.insert(0, os.path.dirname(sys.argv[0])); "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    argv = [sys.executable, "-X", "faulthandler", "-c", bootstrap, __file__]
    argv += ["--in-process", str(model), "--gpu-id", gpu_id]
    argv += ["--tokens", str(tokens), "--reps", str(reps)]
    gpu_ids = (gpu_id,) if gpu_id else ()
    devices = visible_devices_env(LoadSpec(str(model), "speed", num_gpu=999, gpu_ids=gpu_ids))
    env = {**os.environ, **devices, "GGML_NO_BACKTRACE": "1"}
    out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, env=env).stdout
    results = json.loads(out.decode().splitlines()[-1])["results"]
    return {int(streams): rows for streams, rows in results.items()}


def speed_table(api: dict[int, list[dict]], inproc: dict[int, list[dict]]) -> str:
    def med(rows: list[dict], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    lines = [
        "| streams | TTFT ms: API / in-process | decode tok/s per stream: API / in-process "
        "| aggregate tok/s: API / in-process | ratio |",
        "|---|---|---|---|---|",
    ]
    for n in STREAMS:
        a, i = api[n], inproc.get(n)
        if i is None:  # the in-process child failed: the API path alone
            lines.append(
                f"| {n} | {med(a, 'ttft') * 1e3:.1f} / — | {med(a, 'decode_tps'):.0f} / — "
                f"| {med(a, 'aggregate_tps'):.0f} / — | — |"
            )
            continue
        lines.append(
            f"| {n} | {med(a, 'ttft') * 1e3:.1f} / {med(i, 'ttft') * 1e3:.1f} "
            f"| {med(a, 'decode_tps'):.0f} / {med(i, 'decode_tps'):.0f} "
            f"| {med(a, 'aggregate_tps'):.0f} / {med(i, 'aggregate_tps'):.0f} "
            f"| {med(a, 'aggregate_tps') / med(i, 'aggregate_tps'):.3f} |"
        )
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------------


@dataclass
class Report:
    target: Target
    command: str
    sections: list[str] = field(default_factory=list)

    def add(self, title: str, text: str, table: str) -> None:
        block = f"### {title}\n\n{text}\n\n{table}\n"
        print(block, flush=True)
        self.sections.append(block)

    def markdown(self) -> str:
        t = self.target
        machine = (
            f"{t.gpu_name} ({t.gpu_total / GiB:.0f} GiB, {t.driver}); {t.engine}; "
            f"{cpu_name()}, {os.cpu_count()} CPUs; Python {platform.python_version()}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        head = ["", "## GPU", "", f"Command: `{self.command}`", "", f"Machine: {machine}.", ""]
        return "\n".join([*head, *self.sections])


async def run(args: argparse.Namespace, workdir: Path) -> int:
    if args.dry_run:
        total = parse_size(args.gpu_total)
        target = Target(False, "sim0", f"simulated {total / GiB:.0f} GiB GPU", total)
    else:
        found = await real_target()
        if isinstance(found, str):
            print(
                f"bench_gpu: {found}; nothing to measure (--dry-run predicts only)", file=sys.stderr
            )
            return NOTHING_MEASURED
        target = found
    report = Report(target, "python scripts/bench_gpu.py " + " ".join(sys.argv[1:]))
    sections = set(args.sections.split(","))
    cases = QUICK if args.quick else CASES

    if "memory" in sections:
        paths = write_models(workdir, {c.model for c in cases})
        rows = []
        for case in cases:
            started = time.monotonic()
            rows.append(await memory_case(target, case, paths[case.model]))
            print(memory_line(rows[-1]), f"({time.monotonic() - started:.1f} s)", file=sys.stderr)
        worst = [abs(r.error) for r in rows if r.error is not None]
        text = (
            "VRAM the scheduler booked for one runner on an empty GPU (fresh scheduler: no "
            "correction yet; the reserve is the per-runner CUDA context) against NVML's count "
            "for the runner process; error = (predicted − after prompt) / after prompt."
            + (f" Worst |error|: {max(worst):.1f} %." if worst else " Predictions only.")
        )
        report.add(
            "Predicted vs measured VRAM", text, "\n".join([MEMORY_HEADER, *map(memory_line, rows)])
        )

    if "eviction" in sections:
        paths = write_models(workdir, {"8B Q4_0"})
        path_b = workdir / "8B_Q4_0-b.gguf"
        if not path_b.exists():
            write_tiny_gguf(path_b, sparse=True, name="8B-b", **MODELS["8B Q4_0"], **COMMON)
        result = await eviction(target, paths["8B Q4_0"], path_b)
        text = (
            "Two 8B Q4_0 models (ctx 8192), `OLLAMA_GPU_OVERHEAD` = free − 1.5 × one "
            "model's prediction; A is loaded and idle (keep-alive forever, 3 models allowed) "
            "when B is requested."
        )
        report.add("Eviction by memory", text, eviction_table(result))

    if "speed" in sections:
        if args.dry_run:  # the plumbing on this machine's own devices, with a tiny model
            model = write_tiny_gguf(workdir / "speed-tiny.gguf")
        else:
            model = workdir / "speed-1B_F16-random.gguf"
            if not model.exists():
                print("writing the random-weight 1B F16 model ...", file=sys.stderr)
                write_tiny_gguf(model, name="speed-1B", seed=1, **MODELS["1B F16"], **COMMON)
        api = await speed_api(model, workdir, args.tokens, args.reps)
        print(f"  API path: {json.dumps(api)}", file=sys.stderr)
        gpu_id = target.gpu_id if target.real else ""
        try:
            inproc = await trio.to_thread.run_sync(
                speed_in_process, model, gpu_id, args.tokens, args.reps
            )
        except subprocess.CalledProcessError as exc:  # keep the API numbers
            print(f"  in-process path failed: {exc}", file=sys.stderr)
            inproc = {}
        text = (
            f"`{model.name}`, {args.tokens} tokens per stream (greedy, EOS ignored), "
            f"{max(STREAMS)} slots of {SPEED_CTX} tokens on both paths; medians of "
            f"{args.reps} repetitions. TTFT: request to first text piece; per-stream decode: "
            "(tokens − 1) / (last piece − first piece); aggregate: all tokens / wall time."
        )
        report.add("Speed: /api/generate vs xllamacpp in-process", text, speed_table(api, inproc))

    if args.append and target.real:
        with args.append.open("a") as out:
            out.write(report.markdown())
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="simulated GPU: predictions only")
    parser.add_argument("--gpu-total", default="80GiB", help="the simulated GPU (--dry-run)")
    parser.add_argument("--quick", action="store_true", help="three memory cases")
    parser.add_argument("--sections", default="memory,eviction,speed")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--workdir", type=Path, help="keep generated models here")
    parser.add_argument("--append", type=Path, help="append the report (real runs only)")
    parser.add_argument("--in-process", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--gpu-id", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process is not None:
        speed_in_process_child(args)
        return
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        sys.exit(trio.run(run, args, args.workdir))
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        code = trio.run(run, args, Path(tmp))
    sys.exit(code)


if __name__ == "__main__":
    main()
