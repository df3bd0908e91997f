"""The GPU context reserve in layouts, and the per-GPU correction learned from measured loads."""

from __future__ import annotations

import logging

import pytest

from ollamatrio.memory import MemoryOptions, estimate, gpu_context_reserve, plan_layout
from ollamatrio.scheduler.calibration import FACTOR_MAX, FACTOR_MIN, VramCalibration
from ollamatrio.scheduler.placement import Placement
from ollamatrio.testing import write_tiny_gguf

MiB = 1 << 20
GiB = 1 << 30
RESERVE = 546 * MiB


def placement(predicted: int, *, factor: float = 1.0, gpu: str = "g0") -> Placement:
    return Placement(
        gpu_ids=(gpu,),
        num_gpu=99,
        vram_by_gpu={gpu: predicted},
        reserve_by_gpu={gpu: RESERVE},
        factor_by_gpu={gpu: factor},
    )


def test_cuda_reserve_is_the_measured_context():
    assert gpu_context_reserve("CUDA") == 546 * MiB
    assert gpu_context_reserve("Metal") == 0
    assert gpu_context_reserve("SomethingNew") == gpu_context_reserve("CUDA")


@pytest.fixture(scope="module")
def est(tmp_path_factory: pytest.TempPathFactory):
    path = write_tiny_gguf(
        tmp_path_factory.mktemp("cal") / "m.gguf",
        layers=8, embd=2048, heads=16, kv_heads=4, ff=5632, vocab=32000, ctx=4096,
        dtype="f16", sparse=True,
    )  # fmt: skip
    from ollamatrio.gguf import read_gguf

    return estimate(read_gguf(path), MemoryOptions(num_ctx=4096))


def test_reserve_is_added_to_each_gpu_and_taken_from_its_capacity(est):
    plain = plan_layout(est, [("g0", 40 * GiB)])
    booked = plan_layout(est, [("g0", 40 * GiB)], reserves={"g0": RESERVE})
    assert plain.fits_fully
    assert booked.fits_fully
    assert booked.vram_by_gpu["g0"] == plain.vram_by_gpu["g0"] + RESERVE

    # Exactly enough room without the reserve (capacity keeps the larger of the two graph
    # reserves free): with the reserve, a layer must stay on the CPU.
    tight = plain.vram_by_gpu["g0"] - est.gpu_graph_full + est.gpu_graph
    assert plan_layout(est, [("g0", tight)]).fits_fully
    partial = plan_layout(est, [("g0", tight)], reserves={"g0": RESERVE})
    assert not partial.fits_fully
    assert partial.vram_by_gpu["g0"] <= tight


def test_factor_scales_the_model_part_only(est):
    plain = plan_layout(est, [("g0", 40 * GiB)], reserves={"g0": RESERVE})
    scaled = plan_layout(est, [("g0", 40 * GiB)], reserves={"g0": RESERVE}, factors={"g0": 1.25})
    model_part = plain.vram_by_gpu["g0"] - RESERVE
    assert scaled.vram_by_gpu["g0"] == int(model_part * 1.25) + RESERVE
    # The factor also shrinks what fits: the scaled booking never exceeds the free memory.
    tight = plain.vram_by_gpu["g0"] - est.gpu_graph_full + est.gpu_graph
    squeezed = plan_layout(est, [("g0", tight)], reserves={"g0": RESERVE}, factors={"g0": 1.25})
    assert not squeezed.fits_fully
    assert squeezed.vram_by_gpu["g0"] <= tight


def test_under_prediction_is_adopted_at_once(caplog):
    cal = VramCalibration()
    predicted = RESERVE + 4 * GiB
    with caplog.at_level(logging.INFO, logger="ollamatrio.scheduler.calibration"):
        cal.observe(placement(predicted), {"g0": RESERVE + int(4.4 * GiB)}, "m")
    assert cal.factor("g0") == pytest.approx(1.1, rel=1e-6)
    assert "correction for this GPU now 1.100" in caplog.text
    assert cal.factor("other") == 1.0


def test_over_prediction_relaxes_halfway():
    cal = VramCalibration()
    cal.observe(placement(RESERVE + 4 * GiB), {"g0": RESERVE + int(3.8 * GiB)})
    assert cal.factor("g0") == pytest.approx(0.975, rel=1e-6)


def test_a_later_load_is_judged_against_the_factor_it_was_placed_with():
    cal = VramCalibration()
    cal.observe(placement(RESERVE + 4 * GiB), {"g0": RESERVE + int(4.8 * GiB)})
    assert cal.factor("g0") == pytest.approx(1.2)
    # Placed with 1.2 and measured exactly as booked: the factor holds.
    booked = RESERVE + int(1.2 * 2 * GiB)
    cal.observe(placement(booked, factor=1.2), {"g0": booked})
    assert cal.factor("g0") == pytest.approx(1.2, rel=1e-6)


def test_factor_is_bounded():
    cal = VramCalibration()
    cal.observe(placement(RESERVE + 1 * GiB), {"g0": RESERVE + 10 * GiB})
    assert cal.factor("g0") == FACTOR_MAX
    for _ in range(20):
        cal.observe(placement(RESERVE + 4 * GiB), {"g0": RESERVE + 1 * GiB})
    assert cal.factor("g0") == FACTOR_MIN


def test_small_or_unmeasured_shares_teach_nothing():
    cal = VramCalibration()
    cal.observe(placement(RESERVE + 100 * MiB), {"g0": RESERVE + 300 * MiB})  # noise-sized
    cal.observe(placement(RESERVE + 4 * GiB), {})  # NVML gave no per-process figure
    cal.observe(placement(RESERVE + 4 * GiB), {"g0": 0})
    assert cal.factors == {}
