"""Placement decisions, table-tested: a memory estimate and device rooms in, a plan out."""

from __future__ import annotations

from pathlib import Path

import pytest

from ollamatrio.gguf import read_gguf
from ollamatrio.memory import Estimate, MemoryOptions, estimate, plan_layout
from ollamatrio.scheduler.placement import DeviceRoom, choose_placement

GiB = 1 << 30


@pytest.fixture(scope="module")
def est(tmp_path_factory: pytest.TempPathFactory) -> Estimate:
    from ollamatrio.testing import write_tiny_gguf

    path = write_tiny_gguf(
        Path(tmp_path_factory.mktemp("placement")) / "m.gguf",
        layers=16, embd=4096, heads=32, kv_heads=8, ff=11008, vocab=32000,
        dtype="f16", sparse=True,
    )  # fmt: skip
    return estimate(read_gguf(path), MemoryOptions(num_ctx=4096))


def full_vram(est: Estimate) -> int:
    """What one GPU needs to hold the whole model."""
    return plan_layout(est, [("x", 1 << 50)]).vram_by_gpu["x"]


def rooms(est: Estimate, *specs: tuple[str, str, float, bool]) -> list[DeviceRoom]:
    """(id, library, free as a multiple of the full-model VRAM, integrated)."""
    need = full_vram(est)
    return [DeviceRoom(i, lib, int(need * x), integ) for i, lib, x, integ in specs]


@pytest.mark.parametrize(
    ("gpus", "kwargs", "expected_ids", "fully"),
    [
        ([("a", "CUDA", 1.2, False)], {}, ("a",), True),
        ([("a", "CUDA", 1.2, False), ("b", "CUDA", 3.0, False)], {}, ("b",), True),
        ([("a", "CUDA", 3.0, True), ("b", "CUDA", 1.2, False)], {}, ("b",), True),
        ([("a", "CUDA", 0.6, False), ("b", "CUDA", 0.6, False)], {}, ("a", "b"), True),
        (
            [("a", "CUDA", 0.6, False), ("b", "CUDA", 0.6, False), ("c", "CUDA", 0.6, False),
             ("d", "CUDA", 0.6, False)],
            {},
            2,
            True,
        ),
        (
            [("a", "CUDA", 1.5, False), ("b", "CUDA", 1.5, False)],
            {"spread": True},
            ("a", "b"),
            True,
        ),
        ([("a", "CUDA", 3.0, False), ("b", "CUDA", 3.0, False)], {"main_gpu": 1}, ("b",), True),
        (
            [("a", "ROCm", 0.7, False), ("b", "CUDA", 0.7, False), ("c", "CUDA", 0.7, False)],
            {},
            ("b", "c"),
            True,
        ),
        ([("a", "CUDA", 0.5, False)], {}, ("a",), False),
        ([("a", "CUDA", 3.0, False)], {"num_gpu": 0}, (), False),
    ],
    ids=[
        "one-gpu", "best-single-gpu", "discrete-before-integrated", "pair-when-none-alone",
        "smallest-group-of-four", "spread-uses-all", "main-gpu", "one-library-group",
        "partial-offload", "num-gpu-zero-cpu",
    ],
)  # fmt: skip
def test_choose_placement(est, gpus, kwargs, expected_ids, fully):
    placement = choose_placement(est, rooms(est, *gpus), 64 * GiB, **kwargs)
    assert placement is not None
    if isinstance(expected_ids, int):
        assert len(placement.gpu_ids) == expected_ids
    else:
        assert placement.gpu_ids == expected_ids
    assert placement.fits_fully == fully
    if fully:
        assert placement.num_gpu == est.block_count + 1
        assert sum(placement.vram_by_gpu.values()) >= est.weights - est.input_weights
    if len(placement.gpu_ids) > 1:
        assert len(placement.tensor_split) == len(placement.gpu_ids)


def test_no_full_fit_without_partial_is_none(est):
    assert choose_placement(est, rooms(est, ("a", "CUDA", 0.5, False)), 64 * GiB,
                            allow_partial=False) is None  # fmt: skip


def test_cpu_only_needs_host_room(est):
    assert choose_placement(est, [], est.total) is not None
    assert choose_placement(est, [], est.total - 1) is None


def test_partial_offload_needs_host_room_for_the_rest(est):
    gpus = rooms(est, ("a", "CUDA", 0.5, False))
    placement = choose_placement(est, gpus, 64 * GiB)
    assert placement is not None
    assert choose_placement(est, gpus, placement.host_bytes - 1) is None


def test_gpu_overhead_is_reserved(est):
    gpus = rooms(est, ("a", "CUDA", 1.05, False))
    assert choose_placement(est, gpus, 64 * GiB).fits_fully
    tight = choose_placement(est, gpus, 64 * GiB, gpu_overhead=full_vram(est) // 10)
    assert tight is not None
    assert not tight.fits_fully
