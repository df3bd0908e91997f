#!/usr/bin/env python3
"""Benchmark the token relay: what the server costs per streamed token, and its time to first
token and throughput against llama.cpp's own socket, at several concurrent streams.

A tiny generated model (random weights, so decoding is fast and the relay, not the model,
dominates) is imported into a temporary store and served by ``python -m ollamatrio serve`` in
a subprocess, so the server's CPU time (``psutil``, the server process alone, not its
runners) can be divided by the tokens it relayed.  The reference is a runner this script
starts itself with the same options, hit directly on its Unix socket with the same client
library (httpx) as the API path, so client-side costs cancel out.  Both paths get the same
raw prompt, greedy sampling, ``ignore_eos`` and ``num_predict``; every client holds one
keep-alive connection, as the official clients do.  Paths alternate round by round.

    .venv/bin/python scripts/bench_relay.py [--streams 1,4,8,32] [--tokens 64] [--rounds 5]

Columns: server CPU µs per relayed token; TTFT p50/p99 (request sent -> first token) through
the API and direct; aggregate tokens/s through the API over direct.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import trio

from ollamatrio.engines.llamacpp_wire import completion_request
from ollamatrio.engines.process import ProcessEngine, ProcessEngineFactory
from ollamatrio.engines.protocol import CompletionRequest, LoadSpec
from ollamatrio.store import ModelStore
from ollamatrio.testing import write_tiny_gguf

PROMPT = "Once upon a time"


@dataclass
class Round:
    ttfts: list[float]
    tokens: int
    wall: float
    server_cpu: float = 0.0
    server_sys: float = 0.0  # the kernel's share of server_cpu (socket system calls)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def options(tokens: int, threads: int) -> dict[str, object]:
    return {
        "num_predict": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "num_thread": threads,
        "num_ctx": 256,
    }


async def api_stream(client: httpx.AsyncClient, tokens: int, threads: int) -> tuple[float, int]:
    body = {"model": "tiny", "prompt": PROMPT, "raw": True, "options": options(tokens, threads)}
    start = time.perf_counter()
    ttft = 0.0
    count = 0
    async with client.stream("POST", "/api/generate", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line:
                continue
            obj = json.loads(line)
            if obj.get("response"):
                count += 1
                ttft = ttft or time.perf_counter() - start
    return ttft, count


async def direct_stream(runner: httpx.AsyncClient, body: bytes) -> tuple[float, int]:
    """The same request on the runner's socket, with the same client library as the API
    path (so client-side costs cancel out of the comparison)."""
    start = time.perf_counter()
    ttft = 0.0
    count = 0
    async with runner.stream("POST", "/completion", content=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and json.loads(line[6:]).get("content"):
                count += 1
                ttft = ttft or time.perf_counter() - start
    return ttft, count


async def run_round(streams: int, one: object) -> Round:
    ttfts: list[float] = []
    total = 0

    async def client(i: int) -> None:
        nonlocal total
        ttft, count = await one(i)  # type: ignore[operator]
        ttfts.append(ttft)
        total += count

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(streams):
            nursery.start_soon(client, i)
    return Round(ttfts, total, time.perf_counter() - start)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(args: argparse.Namespace) -> None:
    stream_counts = [int(s) for s in args.streams.split(",")]
    most = max(stream_counts)
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as tmp:
        root = Path(tmp)
        model = write_tiny_gguf(root / "tiny.gguf", layers=2, embd=64, vocab=300, ctx=4096)
        store = ModelStore(root / "models")
        for _ in store.import_gguf("tiny", model):
            pass
        port = free_port()
        env = dict(
            os.environ,
            OLLAMA_HOST=f"127.0.0.1:{port}",
            OLLAMA_MODELS=str(store.root),
            OLLAMA_NUM_PARALLEL=str(most),
            OLLAMA_KEEP_ALIVE="-1",
            OLLAMA_MAX_QUEUE="4096",
        )
        if args.server_path:  # serve another checkout's code (A/B against an older version)
            env["PYTHONPATH"] = args.server_path  # an absolute path
        server = await trio.lowlevel.open_process(
            [sys.executable, "-m", "ollamatrio", "serve"],
            env=env,
            # ``python -m`` puts the working directory ahead of PYTHONPATH: run from the
            # other checkout, or this checkout's package is the one imported.
            cwd=args.server_path or None,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if args.profile:
            profiler = await trio.lowlevel.open_process(
                ["py-spy", "record", "-p", str(server.pid), "-o", args.profile, "-f", "raw",
                 "-r", "200"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            await measure(args, stream_counts, most, model, port, server.pid)
        finally:
            if args.profile:
                profiler.send_signal(2)
                with trio.move_on_after(30):
                    await profiler.wait()
            server.terminate()
            with trio.move_on_after(30):
                await server.wait()
            server.kill()


async def measure(
    args: argparse.Namespace, stream_counts: list[int], most: int, model: Path, port: int,
    server_pid: int,
) -> None:  # fmt: skip
    server = psutil.Process(server_pid)
    url = f"http://127.0.0.1:{port}"
    clients = [httpx.AsyncClient(base_url=url, timeout=120) for _ in range(most)]
    with trio.fail_after(60):
        while True:
            try:
                await clients[0].get("/api/version")
                break
            except httpx.TransportError:
                await trio.sleep(0.1)
    spec = LoadSpec(
        model_path=str(model), name="tiny", num_ctx=256, num_parallel=most, num_batch=512,
        num_thread=args.threads, num_gpu=0 if args.cpu else -1,
    )  # fmt: skip
    factory = ProcessEngineFactory(load_timeout=120)
    async with factory.open(spec) as engine:
        assert isinstance(engine, ProcessEngine)
        runner = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=engine.ready["socket"]),
            base_url="http://runner",
            headers={"Authorization": f"Bearer {engine._config.api_key}"},
            timeout=120,
        )
        _, body = completion_request(
            CompletionRequest(prompt=PROMPT, options=options(args.tokens, args.threads)),
            engine.context_length,
        )
        direct_body = json.dumps(body).encode()

        async def via_api(i: int) -> tuple[float, int]:
            return await api_stream(clients[i], args.tokens, args.threads)

        async def via_direct(i: int) -> tuple[float, int]:
            return await direct_stream(runner, direct_body)

        # Load the model in the server and warm every client's connection.
        await run_round(most, via_api)
        await run_round(most, via_direct)
        rows = []
        for streams in stream_counts:
            api_rounds: list[Round] = []
            direct_rounds: list[Round] = []
            for _ in range(args.rounds):
                before = server.cpu_times()
                r = await run_round(streams, via_api)
                after = server.cpu_times()
                r.server_sys = after.system - before.system
                r.server_cpu = (after.user - before.user) + r.server_sys
                api_rounds.append(r)
                direct_rounds.append(await run_round(streams, via_direct))
            rows.append((streams, api_rounds, direct_rounds))
        await runner.aclose()
    for c in clients:
        await c.aclose()

    print(
        f"tiny model, {args.tokens} tokens per request, {args.rounds} rounds per row, "
        f"llama.cpp threads {args.threads}, one keep-alive client per stream"
    )
    print(
        "| streams | server CPU µs/token (kernel) | TTFT p50 ms API / direct "
        "| TTFT p99 ms API / direct | tokens/s API / direct (ratio) |"
    )
    print("|---|---|---|---|---|")
    for streams, api_rounds, direct_rounds in rows:
        relayed = sum(r.tokens for r in api_rounds)
        cpu = sum(r.server_cpu for r in api_rounds) / relayed
        kernel = sum(r.server_sys for r in api_rounds) / relayed
        api_ttft = [t for r in api_rounds for t in r.ttfts]
        direct_ttft = [t for r in direct_rounds for t in r.ttfts]
        api_tps = statistics.median(r.tokens / r.wall for r in api_rounds)
        direct_tps = statistics.median(r.tokens / r.wall for r in direct_rounds)
        ttft50 = statistics.median(api_ttft) * 1e3, statistics.median(direct_ttft) * 1e3
        print(
            f"| {streams} | {cpu * 1e6:.1f} ({kernel * 1e6:.1f}) "
            f"| {ttft50[0]:.2f} / {ttft50[1]:.2f} "
            f"| {pct(api_ttft, 0.99) * 1e3:.2f} / {pct(direct_ttft, 0.99) * 1e3:.2f} "
            f"| {api_tps:.0f} / {direct_tps:.0f} ({api_tps / direct_tps:.3f}) |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,4,8,32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cpu", action="store_true", help="keep the direct runner off GPUs")
    parser.add_argument("--profile", help="record the server with py-spy (raw) into this file")
    parser.add_argument(
        "--server-path", type=os.path.abspath, help="serve the ollamatrio package of this checkout"
    )
    trio.run(main, parser.parse_args())
