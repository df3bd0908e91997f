#!/usr/bin/env python3
"""How models generating at once share the CPU cores: tokens/s per stream, and each stream's
share of what its model does alone, in the same run.

SmolLM2 is copied under four names (A, B, C and E), each copy one byte apart in its
``general.name``, so that every name is a model file of its own and gets a runner of its own
(both servers key runners by the model's blob).  ``python -m ollamatrio serve`` serves them
with ``OLLAMA_MAX_LOADED_MODELS=4``, ``OLLAMA_NUM_PARALLEL=1`` and ``OLLAMA_KEEP_ALIVE=-1``;
every model is loaded and warmed (one short generation, or one embedding batch for E) before
anything is measured.  Each stream is a streamed ``/api/chat`` with a fixed prompt that asks
for a long answer, ``num_predict`` ``--num-predict``, temperature 0 and ``ignore_eos`` (which
Ollama ignores: the prompt keeps SmolLM2 talking), on a keep-alive connection of its own.

Scenarios (``--scenarios``; the alone speeds are measured every round whatever is chosen,
since every share needs them):

- ``alone``: each model by itself, the reference speeds;
- ``two``: A and B at once (target: each share >= 0.4, sum >= 0.85);
- ``three``: A, B and C at once (target: sum >= 0.8);
- ``busy``: A beside a busy-looping Python process (target: share >= 0.6);
- ``embed``: a chat stream on A while ``/api/embed`` batches run back to back on E (target:
  chat share >= 0.4; the embedding throughput alone and together, inputs/s).

The streams of a scenario start together.  tok/s is ``eval_count / eval_duration`` of the
final answer (the server's own count); wall tok/s is ``eval_count`` over request sent -> done.
Share = the stream's tok/s over its model's alone tok/s (medians over ``--rounds``).

    .venv/bin/python scripts/bench_cores.py [--rounds 3] [--num-predict 128]
        [--scenarios alone,two,three,busy,embed] [--against-ollama] [--model PATH.gguf]

``--against-ollama``: afterwards, the reference Ollama (``scripts/ollama_ref.py``: release
0.24 from ``../shared/ollama/``) serves the same four files with the same settings and runs the
same rounds (never at the same time as ollamatrio); a second table compares the two.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
from bench_api import DEFAULT_SMOLLM2
from bench_relay import start_server
from ollama_ref import find_tarball, free_port, running_ollama

from ollamatrio.store import ModelStore, import_gguf

SCENARIOS = ("alone", "two", "three", "busy", "embed")
CHAT_MODELS = ("A", "B", "C")
EMBED_MODEL = "E"
PROMPT = (
    "Write a long, detailed story about a lighthouse keeper who rescues a ship during a storm. "
    "Describe the sea, the weather, the ship, every member of its crew and what each of them "
    "did, hour by hour, in at least two thousand words."
)
EMBED_INPUTS = [f"Sentence {i}: the lighthouse keeper watched the storm roll in." for i in range(8)]
# Both servers; bench_relay.start_server sets the other two for ollamatrio itself.
SERVER_ENV = {"OLLAMA_MAX_LOADED_MODELS": "4"}
OLLAMA_ENV = {**SERVER_ENV, "OLLAMA_NUM_PARALLEL": "1", "OLLAMA_KEEP_ALIVE": "-1"}
# A pause before each measurement, so that the runners which just worked are idle (their
# threads spin a moment after the last batch before they sleep).
SETTLE = 1.0
NUM_CTX = 1024  # the same on every request, the warm-up's included (no reload between them)


@dataclass
class Sample:
    """One stream in one round: ``rate`` is tok/s (inputs/s for an embedding stream)."""

    rate: float
    wall_rate: float
    count: int  # tokens decoded (inputs embedded)


@dataclass
class Target:
    """A share floor for each stream, and one for their sum."""

    each: float | None = None
    total: float | None = None


TARGETS = {
    "two": Target(each=0.4, total=0.85),
    "three": Target(total=0.8),
    "busy": Target(each=0.6),
    "embed": Target(each=0.4),
}


@dataclass
class Results:
    """One server's samples: (scenario, stream) -> one per round; notes say what it lacks."""

    server: str
    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, scenario: str, measured: dict[str, Sample]) -> None:
        for stream, sample in measured.items():
            self.samples.setdefault((scenario, stream), []).append(sample)

    def median(self, scenario: str, stream: str) -> Sample | None:
        samples = self.samples.get((scenario, stream))
        if not samples:
            return None
        return Sample(
            statistics.median(s.rate for s in samples),
            statistics.median(s.wall_rate for s in samples),
            int(statistics.median(s.count for s in samples)),
        )


def model_copy(source: Path, dest: Path, tag: str) -> Path:
    """``source`` with the last character of its ``general.name`` replaced by ``tag``: the
    same model in a file (and so a blob) of its own."""
    with source.open("rb") as f:
        head = f.read(1 << 20)
    key = b"general.name"
    at = head.find(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    kind, length = struct.unpack_from("<IQ", head, at)
    if at < 8 + len(key) or kind != 8 or length == 0:  # 8: GGUF string
        raise SystemExit(f"{source}: no general.name string to tell the copies apart")
    shutil.copyfile(source, dest)
    with dest.open("r+b") as f:
        f.seek(at + 12 + length - 1)
        f.write(tag.encode())
    return dest


def chat_options(num_predict: int) -> dict[str, object]:
    return {"num_predict": num_predict, "temperature": 0, "ignore_eos": True, "num_ctx": NUM_CTX}


async def chat(client: httpx.AsyncClient, model: str, num_predict: int) -> Sample:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "options": chat_options(num_predict),
    }
    start = time.perf_counter()
    final: dict[str, Any] = {}
    async with client.stream("POST", "/api/chat", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{model}: {r.status_code} {(await r.aread()).decode()}")
        async for line in r.aiter_lines():
            if line and (obj := json.loads(line)).get("done"):
                final = obj
    wall = time.perf_counter() - start
    count = int(final.get("eval_count", 0))
    seconds = int(final.get("eval_duration", 0)) / 1e9
    return Sample(count / seconds if seconds else 0.0, count / wall, count)


async def embed_batch(client: httpx.AsyncClient) -> None:
    body = {"model": EMBED_MODEL, "input": EMBED_INPUTS, "options": {"num_ctx": NUM_CTX}}
    r = await client.post("/api/embed", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"{r.status_code} {r.text}")
    if len(r.json().get("embeddings", [])) != len(EMBED_INPUTS):
        raise RuntimeError(f"not one embedding per input: {r.text[:200]}")


async def embed_until(client: httpx.AsyncClient, done: Callable[[], bool]) -> Sample:
    """Embedding batches back to back until ``done()``; a batch under way is finished (a
    cancelled one would be lost work the server still does)."""
    start = time.perf_counter()
    batches = 0
    while not batches or not done():
        await embed_batch(client)
        batches += 1
    inputs = batches * len(EMBED_INPUTS)
    rate = inputs / (time.perf_counter() - start)
    return Sample(rate, rate, inputs)


async def together(jobs: dict[str, Callable[[], Awaitable[Sample]]]) -> dict[str, Sample]:
    """Run the jobs at once (tasks started in one nursery step begin in the same batch);
    their samples by stream."""
    out: dict[str, Sample] = {}

    async def one(name: str, job: Callable[[], Awaitable[Sample]]) -> None:
        out[name] = await job()

    async with trio.open_nursery() as nursery:
        for name, job in jobs.items():
            nursery.start_soon(one, name, job)
    return out


@asynccontextmanager
async def busy_process() -> AsyncIterator[None]:
    """A Python process spinning on one core for the block."""
    process = await trio.lowlevel.open_process([sys.executable, "-c", "while True: pass"])
    try:
        await trio.sleep(0.5)  # running, and seen by the kernel's scheduler as busy
        yield
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


class Bench:
    """The rounds on one server: one keep-alive client per model (a model is one stream)."""

    def __init__(self, url: str, args: argparse.Namespace, results: Results) -> None:
        self.clients = {
            name: httpx.AsyncClient(base_url=url, timeout=600)
            for name in (*CHAT_MODELS, EMBED_MODEL)
        }
        self.args = args
        self.results = results
        self.scenarios: list[str] = args.scenarios
        self.embeds = "embed" in self.scenarios

    def chat_job(self, model: str) -> Callable[[], Awaitable[Sample]]:
        return lambda: chat(self.clients[model], model, self.args.num_predict)

    async def warm(self) -> None:
        """Load every model and answer once through its client, so no load is measured."""
        for model in self.chat_models():
            await chat(self.clients[model], model, 4)
        if self.embeds:
            try:
                await embed_batch(self.clients[EMBED_MODEL])
            except RuntimeError as e:
                self.results.notes.append(f"/api/embed on SmolLM2 refused: {e}")
                self.embeds = False

    def chat_models(self) -> tuple[str, ...]:
        return CHAT_MODELS if "three" in self.scenarios else CHAT_MODELS[:2]

    async def round(self, number: int) -> None:
        models = self.chat_models()
        shift = number % len(models)  # each round starts with the next model: none always first
        for model in models[shift:] + models[:shift]:
            await self.measure("alone", {model: self.chat_job(model)})
        if self.embeds:  # alone for as long as A's chat stream took alone
            a = self.results.samples["alone", "A"][-1]
            seconds = a.count / a.wall_rate if a.wall_rate else 1.0
            await self.measure("alone", {EMBED_MODEL: self.embed_for(seconds)})
        if "two" in self.scenarios:
            await self.measure("two", {m: self.chat_job(m) for m in "AB"})
        if "three" in self.scenarios:
            await self.measure("three", {m: self.chat_job(m) for m in "ABC"})
        if "busy" in self.scenarios:
            async with busy_process():
                await self.measure("busy", {"A": self.chat_job("A")})
        if self.embeds:
            await self.embed_round()

    async def measure(
        self, scenario: str, jobs: dict[str, Callable[[], Awaitable[Sample]]]
    ) -> None:
        await trio.sleep(SETTLE)
        self.results.add(scenario, await together(jobs))

    def embed_for(self, seconds: float) -> Callable[[], Awaitable[Sample]]:
        async def job() -> Sample:
            until = time.perf_counter() + max(1.0, seconds)
            return await embed_until(self.clients[EMBED_MODEL], lambda: time.perf_counter() > until)

        return job

    async def embed_round(self) -> None:
        chat_done = False

        async def chat_then_flag() -> Sample:
            nonlocal chat_done
            try:
                return await self.chat_job("A")()
            finally:
                chat_done = True

        async def embed() -> Sample:
            return await embed_until(self.clients[EMBED_MODEL], lambda: chat_done)

        await self.measure("embed", {"A": chat_then_flag, EMBED_MODEL: embed})

    async def run(self) -> None:
        await self.warm()
        for number in range(self.args.rounds):
            print(f"{self.results.server}: round {number + 1} of {self.args.rounds}", flush=True)
            await self.round(number)
        for client in self.clients.values():
            await client.aclose()


async def bench_ollamatrio(args: argparse.Namespace, files: dict[str, Path], tmp: Path) -> Results:
    results = Results(f"ollamatrio ({args.code.name})" if args.code else "ollamatrio")
    store = ModelStore(tmp / "models")
    for name, path in files.items():
        for _ in import_gguf(store, name, path):
            pass
    env = {**SERVER_ENV, "OLLAMATRIO_DATA": str(tmp / "data")}
    async with trio.open_nursery() as nursery:
        # One slot per runner (OLLAMA_NUM_PARALLEL), this checkout's code (or --code's), no
        # profiler.
        code = str(args.code.resolve()) if args.code else None
        port, _, _ = await nursery.start(start_server, nursery, store, 1, code, None, env)
        await Bench(f"http://127.0.0.1:{port}", args, results).run()
        nursery.cancel_scope.cancel()
    return results


async def bench_ollama(args: argparse.Namespace, files: dict[str, Path]) -> Results:
    results = Results("ollama")
    tarball = find_tarball(args.ollama_tarball)
    async with running_ollama(tarball, free_port(), OLLAMA_ENV) as ollama:
        for name, path in files.items():
            await ollama.create(name, f"FROM {path}\n")
        await Bench(ollama.url, args, results).run()
    return results


def share(results: Results, scenario: str, stream: str) -> float | None:
    sample, alone = results.median(scenario, stream), results.median("alone", stream)
    if sample is None or alone is None or not alone.rate:
        return None
    return sample.rate / alone.rate


def met(value: float, floor: float | None) -> str:
    return "" if floor is None else ("yes" if value >= floor else "no")


def streams_of(results: Results, scenario: str) -> list[str]:
    return sorted(stream for (s, stream) in results.samples if s == scenario)


def report(all_results: list[Results], args: argparse.Namespace) -> None:
    print()
    print(
        f"{args.model.name}, num_predict {args.num_predict}, medians of {args.rounds} rounds; "
        f"tok/s as the server reports it (eval_count / eval_duration); embedding rows: inputs/s "
        f"({len(EMBED_INPUTS)} inputs per /api/embed batch)"
    )
    print(
        "| scenario | server | stream | tok/s | wall tok/s | tokens | share "
        "| sum of shares | target | met |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for scenario in SCENARIOS:
        for results in all_results:
            if scenario in args.scenarios or scenario == "alone":  # the reference, always
                report_scenario(results, scenario)
    for results in all_results:
        for note in results.notes:
            print(f"{results.server}: {note}")
    if len(all_results) == 2:
        report_against_ollama(*all_results)


def report_scenario(results: Results, scenario: str) -> None:
    target = TARGETS.get(scenario, Target())
    shares: list[float] = []
    for stream in streams_of(results, scenario):
        sample = results.median(scenario, stream)
        assert sample is not None
        value = share(results, scenario, stream) if scenario != "alone" else None
        # An embedding stream has a share (against its own throughput alone) but no target.
        floor = target.each if stream != EMBED_MODEL else None
        name = f"{stream} (embed)" if stream == EMBED_MODEL else stream
        if value is not None and stream != EMBED_MODEL:
            shares.append(value)
        cells = [
            scenario, results.server, name, f"{sample.rate:.1f}", f"{sample.wall_rate:.1f}",
            str(sample.count), "" if value is None else f"{value:.2f}", "",
            "" if floor is None else f"≥ {floor}", "" if value is None else met(value, floor),
        ]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    if len(shares) > 1:
        total = sum(shares)
        floor = target.total
        cells = [
            scenario, results.server, "sum", "", "", "", "", f"{total:.2f}",
            "" if floor is None else f"sum ≥ {floor}", met(total, floor),
        ]  # fmt: skip
        print("| " + " | ".join(cells) + " |")


def report_against_ollama(ours: Results, theirs: Results) -> None:
    """Per concurrent scenario: the sum of the chat streams' shares on each server, and their
    summed tok/s with its ratio ollamatrio / Ollama (above 1: ollamatrio decodes more)."""
    rows = []
    for scenario in ("two", "three", "busy", "embed"):
        sums, rates = [], []
        for results in (ours, theirs):
            chats = [s for s in streams_of(results, scenario) if s != EMBED_MODEL]
            sums.append(sum(share(results, scenario, s) or 0.0 for s in chats))
            medians = [results.median(scenario, s) for s in chats]
            rates.append(sum(m.rate for m in medians if m is not None))
        if all(rates):  # else not run on one side (not chosen, or embeddings refused there)
            rows.append(
                f"| {scenario} | {sums[0]:.2f} | {sums[1]:.2f} | {rates[0]:.1f} | {rates[1]:.1f} "
                f"| {rates[0] / rates[1]:.2f} |"
            )
    if not rows:
        return
    print()
    print("vs Ollama, the same rounds on each server")
    print(
        "| scenario | sum of shares, ollamatrio | sum of shares, Ollama "
        "| chat tok/s, ollamatrio | chat tok/s, Ollama | tok/s ollamatrio / Ollama |"
    )
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-cores-") as name:
        tmp = Path(name)
        files = {
            tag: model_copy(args.model, tmp / f"{tag}.gguf", tag)
            for tag in (*CHAT_MODELS, EMBED_MODEL)
        }
        all_results = [await bench_ollamatrio(args, files, tmp)]
        if args.against_ollama:
            all_results.append(await bench_ollama(args, files))
    report(all_results, args)


def scenario_list(text: str) -> list[str]:
    chosen = [s for s in text.split(",") if s]
    if unknown := set(chosen) - set(SCENARIOS):
        raise argparse.ArgumentTypeError(f"unknown scenarios {sorted(unknown)}; of {SCENARIOS}")
    return chosen


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_SMOLLM2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-predict", type=int, default=128)
    parser.add_argument("--scenarios", type=scenario_list, default=list(SCENARIOS))
    parser.add_argument(
        "--against-ollama", action="store_true",
        help="afterwards, run the same rounds on the reference Ollama (../shared/ollama)",
    )  # fmt: skip
    parser.add_argument("--ollama-tarball", type=Path, help="the reference Ollama's tarball")
    parser.add_argument(
        "--code", type=Path,
        help="serve from another checkout of ollamatrio (the tree before a change, for A/B)",
    )  # fmt: skip
    trio.run(main, parser.parse_args())
