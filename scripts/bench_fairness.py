#!/usr/bin/env python3
"""Fair share of a one-slot model: how long a second client's short request waits behind a
first client's burst of long generations, with fair share against first come, first served,
and what fair share costs in aggregate throughput.

SmolLM2 is imported into a temporary store and served by ``python -m ollamatrio serve`` with
``OLLAMA_NUM_PARALLEL=1`` (one slot), twice: with ``OLLAMATRIO_FAIR_SHARE=1`` (the default)
and ``=0`` (first come, first served), one server at a time, each warmed by one generation.
With authentication off the principal is the client's address, so the two clients connect
from two loopback addresses (httpx's ``local_address``): the *agent* from 127.0.0.1, the
*user* from 127.0.0.2.  A round: the agent sends ``--agents`` concurrent ``/api/generate``
requests, each with a long prompt of its own (``--long-words`` words, a different first line
each, so that no prompt cache serves one from another) and ``num_predict`` ``--num-predict``;
once all but one wait in the queue, the user sends a short question (``--short-predict``
tokens).  Rounds alternate between the servers (``--rounds`` each).

Columns (medians over rounds): the short request's wait (sent -> answer, seconds); how many of
the agent's generations finished before it; one long generation (its prompt's evaluation and
its answer's, ``prompt_eval_duration + eval_duration``: the slot time, not the wait);
aggregate generated tokens/s of the round (every answer's ``eval_count`` over first request
sent -> last answer); and that throughput over first come, first served's.

    .venv/bin/python scripts/bench_fairness.py [--rounds 3] [--agents 12] [--long-words 600]
        [--num-predict 48] [--short-predict 8] [--model PATH.gguf] [--code DIR]

``--code DIR`` serves the first come, first served side from another checkout's code instead
of this one's with the switch off (a tree from before fair share).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
from bench_api import DEFAULT_SMOLLM2
from bench_relay import start_server

from ollamatrio.store import ModelStore, import_gguf

AGENT_ADDRESS = "127.0.0.1"
USER_ADDRESS = "127.0.0.2"


@dataclass
class Results:
    name: str
    short_waits: list[float] = field(default_factory=list)
    before_short: list[int] = field(default_factory=list)
    long_seconds: list[float] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)


def client(url: str, address: str) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(local_address=address)
    return httpx.AsyncClient(base_url=url, transport=transport, timeout=3600)


def long_prompt(i: int, words: int) -> str:
    return f"Request {i}: summarise the following notes.\n" + " ".join(
        f"note{(i * 7 + k) % 97}" for k in range(words)
    )


async def queued(probe: httpx.AsyncClient) -> int:
    models = (await probe.get("/api/ps")).json()["models"]
    return sum(int(m.get("queued", 0)) for m in models)


async def one_round(url: str, args: argparse.Namespace, results: Results) -> None:
    body: dict[str, Any] = {
        "model": "smol", "stream": False,
        "options": {"num_predict": args.num_predict, "temperature": 0, "num_ctx": 4096},
    }  # fmt: skip
    answers: list[dict[str, Any]] = []
    order: list[str] = []
    async with (
        client(url, AGENT_ADDRESS) as agent,
        client(url, USER_ADDRESS) as user,
        httpx.AsyncClient(base_url=url) as probe,
    ):

        async def long(i: int) -> None:
            r = await agent.post(
                "/api/generate", json={**body, "prompt": long_prompt(i, args.long_words)}
            )
            r.raise_for_status()
            answers.append(r.json())
            order.append("long")

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(args.agents):
                nursery.start_soon(long, i)
            while await queued(probe) < args.agents - 1:  # noqa: ASYNC110 - polls the server
                await trio.sleep(0.02)
            sent = time.perf_counter()
            short = {
                **body, "prompt": "What is the capital of France?",
                "options": {**body["options"], "num_predict": args.short_predict},
            }  # fmt: skip
            r = await user.post("/api/generate", json=short)
            r.raise_for_status()
            results.short_waits.append(time.perf_counter() - sent)
            results.before_short.append(order.count("long"))
            answers.append(r.json())
        elapsed = time.perf_counter() - started
    longs = [
        (a.get("prompt_eval_duration", 0) + a.get("eval_duration", 0)) / 1e9 for a in answers[:-1]
    ]
    results.long_seconds.append(statistics.median(longs))
    results.throughput.append(sum(a.get("eval_count", 0) for a in answers) / elapsed)


async def warm(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        body = {"model": "smol", "prompt": "Hello", "stream": False,
                "options": {"num_predict": 4, "num_ctx": 4096}}  # fmt: skip
        (await c.post("/api/generate", json=body)).raise_for_status()


def median(values: list[float] | list[int]) -> float:
    return statistics.median(values) if values else float("nan")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-fairness-") as tmp:
        root = Path(tmp)
        store = ModelStore(root / "models")
        for _ in import_gguf(store, "smol", args.model.resolve()):
            pass
        code = str(args.code.resolve()) if args.code else None
        sides = [
            ("fair share", None, {"OLLAMATRIO_FAIR_SHARE": "1"}),
            ("first come, first served", code, {"OLLAMATRIO_FAIR_SHARE": "0"}),
        ]
        results = {name: Results(name) for name, _, _ in sides}
        for number in range(args.rounds):
            for name, side_code, env in sides:
                # One slot: start_server's ``most``, 1.
                env = {**env, "OLLAMATRIO_DATA": str(root / "data")}
                print(f"{name}: round {number + 1} of {args.rounds}", flush=True)
                async with trio.open_nursery() as nursery:
                    port, _, _ = await nursery.start(
                        start_server, nursery, store, 1, side_code, None, env
                    )
                    url = f"http://127.0.0.1:{port}"
                    await warm(url)
                    await one_round(url, args, results[name])
                    nursery.cancel_scope.cancel()
        fifo = median(results["first come, first served"].throughput)
        print(f"\n## fair share: {args.agents} long generations and one short request, one slot\n")
        print("| queue | short wait s | long done before it | one long s | agg tok/s | vs FIFO |")
        print("|---|---|---|---|---|---|")
        for r in results.values():
            tps = median(r.throughput)
            print(
                f"| {r.name} | {median(r.short_waits):.2f} | {median(r.before_short):.0f} "
                f"| {median(r.long_seconds):.2f} | {tps:.1f} | {tps / fifo:.3f} |"
            )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--agents", type=int, default=12, help="the agent's concurrent requests")
    parser.add_argument("--long-words", type=int, default=600, help="words of each long prompt")
    parser.add_argument("--num-predict", type=int, default=48, help="tokens of each long answer")
    parser.add_argument("--short-predict", type=int, default=8, help="tokens of the short answer")
    parser.add_argument("--model", type=Path, default=DEFAULT_SMOLLM2)
    parser.add_argument("--code", type=Path, help="serve first come, first served from DIR")
    return parser.parse_args()


if __name__ == "__main__":
    trio.run(main, parse_args())
