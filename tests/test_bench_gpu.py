"""``scripts/bench_gpu.py`` without a GPU: its dry run goes through the scheduler against a
simulated GPU, and a real run says in one line that there is nothing to measure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.gpu import no_cuda_reason

from ollamatrio.memory import gpu_context_reserve

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_gpu.py"


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        check=False,
    )


def test_dry_run_predicts_and_evicts(tmp_path: Path) -> None:
    done = bench(
        "--dry-run", "--quick", "--sections", "memory,eviction", "--workdir", str(tmp_path),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    rows = [line for line in lines if line.startswith(("| 1B F16 |", "| 8B Q4_0 |"))]
    assert len(rows) == 3
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [c[4] for c in cells] == ["17/17", "33/33", "16/33"]  # layers on the GPU
    reserve = gpu_context_reserve("CUDA") >> 20
    for predicted, measured in [(c[5], c[6]) for c in cells]:
        assert predicted.endswith(f"({reserve})")  # the runner's CUDA context is booked
        assert int(predicted.split()[0]) > reserve
        assert measured == "—"  # nothing is measured on a simulated GPU
    (eviction,) = [line for line in lines if line.startswith("| 80.00 |")]
    assert eviction.split("|")[5:7] == [" B ", " yes "]


@pytest.mark.skipif(no_cuda_reason() is None, reason="this machine can run the benchmark")
def test_without_a_gpu_it_says_so_and_exits_2(tmp_path: Path) -> None:
    done = bench("--quick", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("bench_gpu: ")
    assert line.endswith("; nothing to measure (--dry-run predicts only)")
