#!/usr/bin/env python3
"""Speculative decoding on SmolLM2 (CPU): decode tokens/s with drafting off, n-gram and auto,
on the three shapes of answer that decide whether drafting pays.

Scenarios (``--scenarios``):

- ``reemit``: an agent re-emitting a ~1,000-character file its context already holds twice
  (as after a read and an earlier edit);
- ``diff``: a unified diff quoting lines of the function in the prompt;
- ``prose``: a story, natural text that repeats nothing of its prompt.

Each is a ``/api/chat`` request (``stream`` false, temperature 0, ``num_predict``
``--num-predict``, ``num_ctx`` 4096), once per mode of the ``speculative`` option in every
round; the modes take turns within a round so that a busy machine slows them alike.  A mode
that needs another drafter reloads the runner (``off`` has none), which costs load time, not
decode time.  Decode tokens/s is the final answer's ``eval_count / eval_duration`` (the
runner's own count and clock); drafted and accepted are its ``draft_count`` and
``draft_accepted_count``.  Medians over ``--rounds``, after one warm-up round.

    .venv/bin/python scripts/bench_speculative.py [--rounds 3] [--num-predict 192]
        [--modes off,ngram,auto] [--scenarios reemit,diff,prose] [--against-ollama]
        [--model PATH.gguf]

``--against-ollama``: afterwards the reference Ollama (``scripts/ollama_ref.py``: release 0.24
from ``../shared/ollama/``, which has no speculative decoding) serves the same file and runs
the same requests without the option; the table adds its tokens/s and auto's ratio to it.
Targets (docs/speculative.md): reemit >= 1.8x off, diff >= 1.3x, prose >= 0.97x.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio
from bench_api import DEFAULT_SMOLLM2
from bench_relay import start_server
from ollama_ref import find_tarball, free_port, running_ollama

from ollamatrio.store import ModelStore, import_gguf

MODEL = "smollm2"
MODES = ("off", "ngram", "auto")
SCENARIOS = ("reemit", "diff", "prose")
TARGETS = {"reemit": 1.8, "diff": 1.3, "prose": 0.97}
NUM_CTX = 4096
SYSTEM = "You are a helpful coding assistant."

# A ~1,000-character file, as an agent's context holds it.
FILE = '''"""Memory a runner process uses, measured rather than predicted."""

from __future__ import annotations

import os

import psutil


def vram_by_gpu(pid: int) -> dict[str, int]:
    """Bytes of GPU memory the process holds, per device id; empty without NVML."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    used: dict[str, int] = {}
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory:
                    used[uuid] = used.get(uuid, 0) + proc.usedGpuMemory
    finally:
        pynvml.nvmlShutdown()
    return used


def host_bytes(pid: int = 0) -> int:
    """Resident memory of the process, without the file pages it maps."""
    info = psutil.Process(pid or os.getpid()).memory_full_info()
    return int(info.uss)
'''

DIFF = (
    f"Here is `measure.py`:\n```python\n{FILE}```\nWrite a unified diff that renames "
    "`host_bytes` to `resident_bytes`, quoting the unchanged lines around it."
)
STORY = (
    "Write a long story about a lighthouse keeper who rescues a ship during a storm. "
    "Describe the sea, the weather, the ship and every member of its crew."
)
MESSAGES: dict[str, list[dict[str, str]]] = {
    "reemit": [
        {"role": "user", "content": f"Read `measure.py`:\n```python\n{FILE}```"},
        {"role": "assistant", "content": f"Here is `measure.py`:\n```python\n{FILE}```"},
        {"role": "user", "content": "Write the whole file again, unchanged, in one code block."},
    ],
    "diff": [{"role": "user", "content": DIFF}],
    "prose": [{"role": "user", "content": STORY}],
}


@dataclass
class Sample:
    rate: float  # decode tokens/s
    tokens: int
    drafted: int | None
    accepted: int | None


@dataclass
class Results:
    server: str
    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)

    def add(self, scenario: str, mode: str, sample: Sample) -> None:
        self.samples.setdefault((scenario, mode), []).append(sample)

    def rate(self, scenario: str, mode: str) -> float | None:
        got = self.samples.get((scenario, mode))
        return statistics.median(s.rate for s in got) if got else None

    def acceptance(self, scenario: str, mode: str) -> str:
        got = [s for s in self.samples.get((scenario, mode), ()) if s.drafted is not None]
        if not got:
            return "-"
        drafted = sum(s.drafted or 0 for s in got)
        accepted = sum(s.accepted or 0 for s in got)
        return f"{accepted}/{drafted}"


async def ask(client: httpx.AsyncClient, scenario: str, mode: str | None, n: int) -> Sample:
    options: dict[str, Any] = {"temperature": 0, "num_predict": n, "num_ctx": NUM_CTX, "seed": 1}
    if mode is not None:
        options["speculative"] = mode
    body = {
        "model": MODEL, "stream": False, "options": options,
        "messages": [{"role": "system", "content": SYSTEM}, *MESSAGES[scenario]],
    }  # fmt: skip
    r = await client.post("/api/chat", json=body, timeout=600)
    r.raise_for_status()
    final = r.json()
    tokens, duration = final.get("eval_count", 0), final.get("eval_duration", 0)
    rate = tokens / (duration / 1e9) if duration else 0.0
    return Sample(rate, tokens, final.get("draft_count"), final.get("draft_accepted_count"))


async def run_rounds(
    url: str, args: argparse.Namespace, results: Results, modes: tuple[str | None, ...]
) -> None:
    async with httpx.AsyncClient(base_url=url) as client:
        for number in range(args.rounds + 1):  # round 0 warms every mode and prompt
            label = "warm-up" if number == 0 else f"round {number} of {args.rounds}"
            print(f"{results.server}: {label}", flush=True)
            for mode in modes:
                # A mode other than the last one's reloads the runner: one short request
                # first, so the load (and the old runner's exit, which the core share reads
                # as cores busy elsewhere for a second) falls on no measured request.
                await ask(client, args.scenarios[0], mode, 1)
                for scenario in args.scenarios:
                    sample = await ask(client, scenario, mode, args.num_predict)
                    if number:
                        results.add(scenario, mode or "off", sample)


async def bench_ollamatrio(args: argparse.Namespace, tmp: Path) -> Results:
    results = Results("ollamatrio")
    store = ModelStore(tmp / "models")
    for _ in import_gguf(store, MODEL, args.model):
        pass
    env = {"OLLAMATRIO_DATA": str(tmp / "data")}
    async with trio.open_nursery() as nursery:
        port, _, _ = await nursery.start(start_server, nursery, store, 1, None, None, env)
        await run_rounds(f"http://127.0.0.1:{port}", args, results, tuple(args.modes))
        nursery.cancel_scope.cancel()
    return results


async def bench_ollama(args: argparse.Namespace) -> Results:
    results = Results("ollama")
    env = {"OLLAMA_NUM_PARALLEL": "1", "OLLAMA_KEEP_ALIVE": "-1"}
    async with running_ollama(find_tarball(args.ollama_tarball), free_port(), env) as ollama:
        await ollama.create(MODEL, f"FROM {args.model.resolve()}\n")
        await run_rounds(ollama.url, args, results, (None,))
    return results


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def rate(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def report(ours: Results, ollama: Results | None, args: argparse.Namespace) -> None:
    modes = list(args.modes)
    head = ["scenario", *(f"{m} tok/s" for m in modes)]
    head += [f"{m}/off" for m in modes if m != "off"] + ["target"]
    head += [f"{m} accepted/drafted" for m in modes if m != "off"]
    if ollama is not None:
        head += ["ollama tok/s", "auto/ollama"]
    rows = []
    for scenario in args.scenarios:
        off = ours.rate(scenario, "off")
        row = [scenario, *(rate(ours.rate(scenario, m)) for m in modes)]
        row += [ratio(ours.rate(scenario, m), off) for m in modes if m != "off"]
        row += [f">= {TARGETS[scenario]}x"]
        row += [ours.acceptance(scenario, m) for m in modes if m != "off"]
        if ollama is not None:
            theirs = ollama.rate(scenario, "off")
            row += [rate(theirs), ratio(ours.rate(scenario, "auto"), theirs)]
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    print()
    print(f"decode tokens/s, median of {args.rounds} rounds, num_predict {args.num_predict}")
    for r in [head, ["-" * w for w in widths], *rows]:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-speculative-") as tmp:
        ours = await bench_ollamatrio(args, Path(tmp))
    ollama = await bench_ollama(args) if args.against_ollama else None
    report(ours, ollama, args)


def listed(choices: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        items = [item for item in text.split(",") if item]
        if unknown := set(items) - set(choices):
            raise argparse.ArgumentTypeError(f"unknown {sorted(unknown)}; of {choices}")
        return items

    return parse


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-predict", type=int, default=192)
    parser.add_argument("--modes", type=listed(MODES), default=list(MODES))
    parser.add_argument("--scenarios", type=listed(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--against-ollama", action="store_true")
    parser.add_argument("--ollama-tarball", type=Path)
    parser.add_argument("--model", type=Path, default=DEFAULT_SMOLLM2)
    trio.run(main, parser.parse_args())
