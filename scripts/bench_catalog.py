#!/usr/bin/env python3
"""Benchmark the model catalog: ``/api/tags``, ``/v1/models`` and ``/api/show`` with many
stored models, through the real app under hypercorn on 127.0.0.1:0.

A generated tiny GGUF is imported once and copied under ``--models`` names (copies share the
blob, so the store holds ``--models`` manifests).  One keep-alive httpx client, as the
official clients use; medians and p99 over ``--reps`` requests each.  "cold" requests follow
a write to the store (a copy and a delete of a scratch model), so the server must read the
store again; "warm" ones are served from memory.

    .venv/bin/python scripts/bench_catalog.py [--models 50] [--reps 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import httpx
import trio

from ollamatrio.api import create_app
from ollamatrio.config import Settings
from ollamatrio.http.front import serve_http
from ollamatrio.scheduler import open_scheduler
from ollamatrio.serve import hypercorn_config
from ollamatrio.store import ModelStore, import_gguf
from ollamatrio.testing import write_tiny_gguf


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(client: httpx.AsyncClient, method: str, path: str, **kw: object) -> float:
    start = time.perf_counter()
    response = await client.request(method, path, **kw)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return elapsed


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-catalog-") as tmp:
        root = Path(tmp)
        store = ModelStore(root / "models")
        for _ in import_gguf(store, "model-0", write_tiny_gguf(root / "tiny.gguf")):
            pass
        for i in range(1, args.models):
            store.copy("model-0", f"model-{i}")
        settings = replace(Settings.from_env({}), host="127.0.0.1", port=0, models_dir=store.root)
        stop = trio.Event()
        async with open_scheduler(settings) as scheduler, trio.open_nursery() as nursery:
            app = create_app(scheduler, store, settings)
            binds = await nursery.start(
                partial(serve_http, app, hypercorn_config(settings), shutdown_trigger=stop.wait)
            )
            async with httpx.AsyncClient(base_url=binds[0], timeout=30) as client:
                requests = {
                    "GET /api/tags": ("GET", "/api/tags", {}),
                    "GET /v1/models": ("GET", "/v1/models", {}),
                    "POST /api/show": ("POST", "/api/show", {"json": {"model": "model-7"}}),
                }
                rows = []
                for label, (method, path, kw) in requests.items():
                    await timed(client, method, path, **kw)  # connection and first read
                    warm = [await timed(client, method, path, **kw) for _ in range(args.reps)]
                    cold = []
                    for _ in range(max(1, args.reps // 10)):
                        await trio.to_thread.run_sync(store.copy, "model-0", "scratch")
                        await trio.to_thread.run_sync(store.delete, "scratch")
                        cold.append(await timed(client, method, path, **kw))
                    rows.append((label, warm, cold))
            stop.set()

    print(f"{args.models} stored models, {args.reps} warm requests each, one keep-alive client")
    print(f"{'request':<16} {'warm p50':>9} {'warm p99':>9} {'cold p50':>9}")
    for label, warm, cold in rows:
        print(
            f"{label:<16} {1e3 * statistics.median(warm):>7.2f}ms "
            f"{1e3 * percentile(warm, 0.99):>7.2f}ms {1e3 * statistics.median(cold):>7.2f}ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--reps", type=int, default=200)
    trio.run(main, parser.parse_args())
