#!/usr/bin/env python3
"""Benchmark ``GET /metrics``: scrape latency with four loaded models, and what metrics
cost decoding, against a server without them.

Four tiny generated models (distinct files, so four real runner processes) are imported
into a temporary store and served by ``python -m ollamatrio serve`` in a subprocess, all
loaded and kept (``OLLAMA_KEEP_ALIVE=-1``).

Scrapes: ``--scrapes`` back-to-back ``GET /metrics`` (the runner series mostly come from
the 1 s cache: a burst costs one round trip per runner), then ``--cold`` scrapes spaced
past the cache's TTL, each of which fetches all four runners' ``/metrics``.

Decode cost: the same server code without metrics (``--baseline-path``, a checkout of the
commit before them, served from that folder) runs beside it with the same models; rounds
of ``--streams`` concurrent streams of ``--tokens`` tokens alternate between the two,
``--rounds`` per side.  All the while a scraper hits the metrics server's ``/metrics``
every ``--scrape-interval`` seconds (0: never), as Prometheus would.  Reported per side:
median aggregate tokens/s and the server process's CPU µs per token (``psutil``).

    .venv/bin/python scripts/bench_metrics.py --baseline-path /tmp/ollamatrio-base \\
        [--rounds 10] [--tokens 256] [--streams 4] [--scrapes 500] [--cold 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import trio
from bench_relay import Round, api_stream, free_port, pct, run_round

from ollamatrio.store import ModelStore, import_gguf
from ollamatrio.testing import write_tiny_gguf

MODELS = ("tiny", "tiny2", "tiny3", "tiny4")  # bench_relay's api_stream asks for "tiny"
TTL = 1.0  # observability/metrics.py RUNNER_SCRAPE_TTL


@dataclass
class Server:
    client: httpx.AsyncClient
    process: psutil.Process


@asynccontextmanager
async def serving(store: Path, streams: int, path: str | None) -> AsyncIterator[Server]:
    port = free_port()
    env = dict(
        os.environ,
        OLLAMA_HOST=f"127.0.0.1:{port}",
        OLLAMA_MODELS=str(store),
        OLLAMA_NUM_PARALLEL=str(streams),
        OLLAMA_KEEP_ALIVE="-1",
        OLLAMA_MAX_LOADED_MODELS=str(len(MODELS)),
    )
    if path:  # serve another checkout's code: ``-m`` puts the working directory first
        env["PYTHONPATH"] = path
    server = await trio.lowlevel.open_process(
        [sys.executable, "-m", "ollamatrio", "serve"], cwd=path,
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120)
    try:
        with trio.fail_after(60):
            while True:
                try:
                    await client.get("/api/version")
                    break
                except httpx.TransportError:
                    await trio.sleep(0.1)  # an external process starting: nothing to wait on
        for model in MODELS:  # an empty request only loads
            (await client.post("/api/generate", json={"model": model})).raise_for_status()
        yield Server(client, psutil.Process(server.pid))
    finally:
        await client.aclose()
        server.terminate()
        with trio.move_on_after(30):
            await server.wait()
        server.kill()


async def timed_scrape(client: httpx.AsyncClient) -> float:
    start = time.perf_counter()
    r = await client.get("/metrics")
    r.raise_for_status()
    assert "llamacpp:tokens_predicted_total" in r.text, "runner series missing"
    return time.perf_counter() - start


async def decode_round(server: Server, args: argparse.Namespace) -> Round:
    async def one(_: int) -> tuple[float, int]:
        return await api_stream(server.client, args.tokens, args.threads)

    before = server.process.cpu_times()
    r = await run_round(args.streams, one)
    after = server.process.cpu_times()
    r.server_sys = after.system - before.system
    r.server_cpu = after.user - before.user + r.server_sys
    return r


async def scrape_every(client: httpx.AsyncClient, interval: float) -> None:
    """Prometheus's part: on its own clock, whatever round is running (so the server's CPU
    for scrapes falls into the metrics side's rounds in proportion to their time)."""
    while True:
        await trio.sleep(interval)
        await timed_scrape(client)


def summary(rounds: list[Round]) -> tuple[float, float, float, float]:
    """Median tokens/s, its min and max, and server CPU µs per token over all rounds."""
    tps = [r.tokens / r.wall for r in rounds]
    cpu = sum(r.server_cpu for r in rounds) / sum(r.tokens for r in rounds)
    return statistics.median(tps), min(tps), max(tps), cpu * 1e6


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        root = Path(tmp)
        store = ModelStore(root / "models")
        for i, name in enumerate(MODELS):
            gguf = write_tiny_gguf(
                root / f"{name}.gguf", layers=2, embd=64, vocab=300, ctx=4096, seed=i, name=name
            )
            for _ in import_gguf(store, name, gguf):
                pass
        async with (
            serving(store.root, args.streams, None) as metrics,
            serving(store.root, args.streams, args.baseline_path) as baseline,
        ):
            no_metrics = await baseline.client.get("/metrics")
            assert no_metrics.status_code == 404, "the baseline serves /metrics: not a baseline"
            await timed_scrape(metrics.client)
            warm = [await timed_scrape(metrics.client) for _ in range(args.scrapes)]
            cold = []
            for _ in range(args.cold):
                await trio.sleep(TTL + 0.05)
                cold.append(await timed_scrape(metrics.client))
            await decode_round(metrics, args)  # warm both servers' connections
            await decode_round(baseline, args)
            with_metrics: list[Round] = []
            without: list[Round] = []
            async with trio.open_nursery() as nursery:
                if args.scrape_interval > 0:
                    nursery.start_soon(scrape_every, metrics.client, args.scrape_interval)
                for _ in range(args.rounds):
                    with_metrics.append(await decode_round(metrics, args))
                    without.append(await decode_round(baseline, args))
                nursery.cancel_scope.cancel()

    load = os.getloadavg()[0]
    print(f"{len(MODELS)} tiny models loaded (real runners); 1-minute load average {load:.2f}")
    for label, times in (("burst (cached runner series)", warm), ("cold (TTL expired)", cold)):
        ms = [t * 1e3 for t in times]
        print(
            f"scrape {label}: n={len(ms)} p50 {statistics.median(ms):.2f} ms, "
            f"p99 {pct(ms, 0.99):.2f} ms"
        )
    tps_m, lo_m, hi_m, cpu_m = summary(with_metrics)
    tps_b, lo_b, hi_b, cpu_b = summary(without)
    print(
        f"decode, {args.streams} streams x {args.tokens} tokens, {args.rounds} interleaved "
        f"rounds per side, /metrics scraped every {args.scrape_interval:g} s (0: never)"
    )
    print("| server | tokens/s median (min–max) | server CPU µs/token |")
    print("|---|---|---|")
    print(f"| metrics | {tps_m:.0f} ({lo_m:.0f}–{hi_m:.0f}) | {cpu_m:.1f} |")
    print(f"| baseline | {tps_b:.0f} ({lo_b:.0f}–{hi_b:.0f}) | {cpu_b:.1f} |")
    print(f"metrics / baseline: tokens/s {tps_m / tps_b:.3f}, CPU per token {cpu_m / cpu_b:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--baseline-path", type=os.path.abspath, required=True,
        help="a checkout without metrics, served with PYTHONPATH",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--cold", type=int, default=30)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    trio.run(main, parser.parse_args())
