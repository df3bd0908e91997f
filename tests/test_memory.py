"""Memory prediction (ollamatrio.memory): KV, compute buffers, layouts."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFWriter

from ollamatrio.gguf import GGUFInfo, read_gguf
from ollamatrio.memory import (
    RUNNER_OVERHEAD,
    Estimate,
    Layout,
    MemoryOptions,
    estimate,
    kv_bytes_per_element,
    plan_layout,
    profile,
)

MiB = 1 << 20
GiB = 1 << 30

SMOL = dict(layers=30, embd=576, heads=9, kv_heads=3, ff=1536, ctx=8192)
LLAMA_8B = dict(layers=32, embd=4096, heads=32, kv_heads=8, ff=14336, ctx=8192)
SMALL = dict(layers=8, embd=256, heads=4, kv_heads=2, ff=768, ctx=4096)

Model = Callable[..., GGUFInfo]


@pytest.fixture
def model(tiny_gguf: Callable[..., Path]) -> Model:
    """A sparse generated model's header (declared size only, nothing written)."""

    def make(**kwargs: Any) -> GGUFInfo:
        return read_gguf(tiny_gguf(sparse=True, dtype="f16", **kwargs))

    return make


def kv_mib(info: GGUFInfo, **opts: Any) -> float:
    return estimate(info, MemoryOptions(**opts)).kv / MiB


# -- KV cache ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "opts", "expected_mib"),
    [
        pytest.param(SMOL, dict(num_ctx=2048), 45.0, id="smollm2-2048"),
        pytest.param(SMOL, dict(num_ctx=8192), 180.0, id="smollm2-8192"),
        pytest.param(SMOL, dict(num_ctx=2048, num_parallel=4), 180.0, id="smollm2-2048x4"),
        pytest.param(SMOL, dict(num_ctx=32768), 180.0, id="clamped-to-training-ctx"),
        pytest.param(SMOL, dict(num_ctx=1000), 22.5, id="padded-to-256-cells"),
        pytest.param(SMOL, dict(num_ctx=1000, num_parallel=3), 67.5, id="padded-per-slot"),
        pytest.param(LLAMA_8B, dict(num_ctx=4096), 512.0, id="llama8b-4096"),
        pytest.param(LLAMA_8B, dict(num_ctx=2048, num_parallel=2), 512.0, id="llama8b-2048x2"),
    ],
)
def test_kv_cache_f16(
    model: Model, shape: dict[str, int], opts: dict[str, int], expected_mib: float
):
    assert kv_mib(model(**shape), **opts) == expected_mib


@pytest.mark.parametrize(
    ("kv_type", "flash", "expected_mib", "used"),
    [
        pytest.param("f16", True, 180.0, "f16", id="f16-fa"),
        pytest.param("q8_0", True, 180.0 * 17 / 32, "q8_0", id="q8_0-fa"),
        pytest.param("q4_0", True, 180.0 * 9 / 32, "q4_0", id="q4_0-fa"),
        pytest.param("q8_0", False, 90.0 * 17 / 32 + 90.0, "K q8_0, V f16",
                     id="q8_0-no-fa-v-falls-back-to-f16"),
        pytest.param("q4_0", False, 90.0 * 9 / 32 + 90.0, "K q4_0, V f16",
                     id="q4_0-no-fa-v-falls-back-to-f16"),
        pytest.param("q8_0", None, 90.0 * 17 / 32 + 90.0, "K q8_0, V f16",
                     id="q8_0-auto-fa-v-falls-back-to-f16"),
        pytest.param("Q4_0", True, 180.0 * 9 / 32, "q4_0", id="type-name-case-insensitive"),
    ],
)  # fmt: skip
def test_a_quantized_v_cache_only_with_flash_attention(
    model: Model, kv_type: str, flash: bool | None, expected_mib: float, used: str
):
    """llama.cpp refuses a quantized V cache without flash attention; a K cache is
    quantized either way (kv_cache.py)."""
    e = estimate(model(**SMOL), MemoryOptions(8192, kv_cache_type=kv_type, flash_attention=flash))
    assert e.kv / MiB == pytest.approx(expected_mib, abs=1e-9)
    assert e.kv_cache_type == used


@pytest.mark.parametrize(
    ("opts", "k", "v"),
    [
        pytest.param(dict(kv_cache_type_k="q8_0"), "q8_0", "f16", id="k-only"),
        pytest.param(dict(kv_cache_type="q8_0", kv_cache_type_v="f16"), "q8_0", "f16",
                     id="side-over-both"),
        pytest.param(dict(kv_cache_type_k="q4_0", kv_cache_type_v="q8_0", flash_attention=True),
                     "q4_0", "q8_0", id="each-side-its-own"),
        pytest.param(dict(kv_cache_type_v="q8_0"), "f16", "f16", id="v-needs-flash"),
        pytest.param(dict(kv_cache_type="f32", kv_cache_type_k="q8_0"), "q8_0", "f32",
                     id="f32-v"),
    ],
)  # fmt: skip
def test_kv_cache_types_per_side(model: Model, opts: dict[str, Any], k: str, v: str):
    """Each side's cache is booked at its own type: SmolLM2's K and V rows are equal, so
    each side is half the f16 total at 8192 (180 MiB)."""
    e = estimate(model(**SMOL), MemoryOptions(8192, **opts))
    assert (e.kv_cache_type_k, e.kv_cache_type_v) == (k, v)
    per_side = {"f16": 90.0, "f32": 180.0, "q8_0": 90.0 * 17 / 32, "q4_0": 90.0 * 9 / 32}
    assert e.kv / MiB == pytest.approx(per_side[k] + per_side[v], abs=1e-9)


def test_a_quantized_side_whose_block_does_not_divide_the_head_size_is_f16(model: Model):
    """Head size 16 (64 / 4 heads): llama.cpp refuses q8_0 there (blocks of 32)."""
    options = MemoryOptions(1024, kv_cache_type="q8_0", flash_attention=True)
    e = estimate(model(layers=2, embd=64, heads=4), options)
    assert (e.kv_cache_type_k, e.kv_cache_type_v) == ("f16", "f16")


@pytest.mark.parametrize(
    ("kv_type", "expected"), [("f16", 2.0), ("q8_0", 34 / 32), ("q4_0", 18 / 32), ("f32", 4.0)]
)
def test_kv_bytes_per_element(kv_type: str, expected: float):
    assert kv_bytes_per_element(kv_type) == expected


def test_unknown_kv_type_is_rejected(model: Model):
    with pytest.raises(ValueError, match="unknown KV cache type"):
        estimate(model(**SMALL), MemoryOptions(2048, kv_cache_type="q3_k"))


def test_per_layer_kv_head_counts(model: Model):
    info = model(
        layers=4, embd=256, heads=4, extra_metadata={"llama.attention.head_count_kv": [4, 2, 1, 4]}
    )
    e = estimate(info, MemoryOptions(2048))
    per_head = 2048 * (64 + 64) * 2  # cells x (K + V head dims) x f16
    assert e.layer_kv == (4 * per_head, 2 * per_head, 1 * per_head, 4 * per_head)


def test_key_and_value_lengths_from_metadata(model: Model):
    info = model(
        layers=2,
        embd=256,
        heads=4,
        kv_heads=2,
        extra_metadata={"llama.attention.key_length": 128, "llama.attention.value_length": 96},
    )
    e = estimate(info, MemoryOptions(1024))
    assert e.layer_kv == (1024 * (128 + 96) * 2 * 2,) * 2


def test_sliding_window_layers_use_the_window(model: Model):
    info = model(
        layers=12,
        embd=256,
        heads=4,
        ctx=8192,
        extra_metadata={
            "llama.attention.sliding_window": 512,
            "llama.attention.sliding_window_pattern": 6,
        },
    )
    e = estimate(info, MemoryOptions(8192, num_parallel=2, num_batch=512))
    row = 2 * 256 * 2  # (K + V) x 4 heads x 64 x f16
    full = 2 * 8192 * row
    window = 2 * 1024 * row  # per slot: 512 window + 512 ubatch cells
    expected = tuple(full if i % 6 == 5 else window for i in range(12))
    assert e.layer_kv == expected


def test_sliding_window_never_exceeds_the_context(model: Model):
    info = model(
        layers=2,
        embd=256,
        heads=4,
        extra_metadata={
            "llama.attention.sliding_window": 4096,
            "llama.attention.sliding_window_pattern": [True, False],
        },
    )
    e = estimate(info, MemoryOptions(1024))
    assert e.layer_kv[0] == e.layer_kv[1] == 1024 * 2 * 256 * 2


def test_sliding_window_of_a_known_architecture(tmp_path: Path):
    # gemma3 files do not store the pattern: llama.cpp hard-codes every 6th layer as global.
    path = tmp_path / "gemma3-header.gguf"
    writer = GGUFWriter(path, "gemma3")
    writer.add_block_count(6)
    writer.add_context_length(8192)
    writer.add_embedding_length(256)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_sliding_window(512)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    cells = [k // (2 * 256 * 2) for k in estimate(read_gguf(path), MemoryOptions(8192)).layer_kv]
    assert cells == [1024] * 5 + [8192]


def test_sliding_window_without_known_pattern_counts_full_context(model: Model):
    info = model(layers=2, embd=256, heads=4, extra_metadata={"llama.attention.sliding_window": 64})
    e = estimate(info, MemoryOptions(2048))
    assert e.layer_kv == (2048 * 2 * 256 * 2,) * 2


def test_recurrent_layers_use_the_ssm_state(model: Model):
    info = model(
        layers=4,
        embd=256,
        heads=4,
        extra_metadata={
            "llama.attention.head_count_kv": [4, 0, 4, 0],
            "llama.ssm.conv_kernel": 4,
            "llama.ssm.inner_size": 512,
            "llama.ssm.state_size": 16,
            "llama.ssm.group_count": 1,
        },
    )
    e = estimate(info, MemoryOptions(2048, num_parallel=2))
    state = 4 * (3 * (512 + 2 * 1 * 16) + 16 * 512)  # f32, per sequence
    attention = 2 * 2048 * 2 * 256 * 2
    assert e.layer_kv == (attention, 2 * state, attention, 2 * state)


# -- weights -------------------------------------------------------------------------------


def test_weights_split_into_input_blocks_and_output(model: Model):
    info = model(**SMALL, vocab=1000)
    e = estimate(info, MemoryOptions(2048))
    by_layer = info.layer_tensors()
    assert e.layer_weights == tuple(sum(t.nbytes for t in by_layer[i]) for i in range(8))
    embd = info.tensor("token_embd.weight")
    output = info.tensor("output.weight")
    norm = info.tensor("output_norm.weight")
    assert embd is not None
    assert output is not None
    assert norm is not None
    assert e.input_weights == embd.nbytes
    assert e.output_weights == e.output_host_weights == output.nbytes + norm.nbytes
    assert e.weights == info.tensor_bytes


@pytest.mark.slow
def test_smollm2_real_file(smollm2_path: Path):
    info = read_gguf(smollm2_path)
    assert kv_mib(info, num_ctx=2048) == 45.0
    assert kv_mib(info, num_ctx=8192) == 180.0
    e = estimate(info, MemoryOptions(2048))
    assert e.weights == info.tensor_bytes == 96_576_768  # llama.cpp: CPU model buffer 92.10 MiB
    embd = info.tensor("token_embd.weight")
    norm = info.tensor("output_norm.weight")
    assert embd is not None
    assert norm is not None
    # Tied output: a GPU needs a copy of token_embd, the CPU only the norm besides its own.
    assert e.output_weights == embd.nbytes + norm.nbytes
    assert e.output_host_weights == norm.nbytes


# -- compute buffers -----------------------------------------------------------------------

# llama.cpp's own "CPU compute buffer size" (verbosity 4), measured with xllamacpp on this
# machine: (shape, num_ctx, num_batch, flash attention, MiB).
MEASURED_COMPUTE = [
    pytest.param(SMOL, 2048, 512, True, 16.64, id="smollm2-2048-fa"),
    pytest.param(SMOL, 8192, 512, True, 22.64, id="smollm2-8192-fa"),
    pytest.param(SMOL, 512, 512, True, 15.14, id="smollm2-512-fa"),
    pytest.param(SMOL, 2048, 512, False, 47.51, id="smollm2-2048-no-fa"),
    pytest.param(dict(layers=30, embd=512, heads=8, ff=1024), 2048, 512, True, 13.02, id="l30"),
    pytest.param(
        dict(layers=30, embd=512, heads=8, ff=1024), 2048, 256, True, 6.51, id="l30-ubatch256"
    ),
    pytest.param(
        dict(layers=30, embd=512, heads=8, ff=1024, ctx=8192),
        8192,
        512,
        False,
        152.01,
        id="l30-8192-no-fa",
    ),
    pytest.param(
        dict(layers=2, embd=4096, heads=32, kv_heads=8, ff=14336),
        2048,
        512,
        True,
        126.02,
        id="wide-fa",
    ),
    pytest.param(
        dict(layers=2, embd=4096, heads=32, kv_heads=8, ff=14336),
        2048,
        512,
        False,
        184.01,
        id="wide-no-fa",
    ),
    pytest.param(
        dict(layers=2, embd=4096, heads=32, ff=4096, ctx=8192),
        8192,
        512,
        False,
        592.01,
        id="square-8192-no-fa",
    ),
    pytest.param(
        dict(layers=2, embd=2048, heads=16, ff=8192), 512, 512, True, 68.52, id="ffn-bound"
    ),
]


@pytest.mark.parametrize(("shape", "ctx", "batch", "flash", "measured_mib"), MEASURED_COMPUTE)
def test_cpu_compute_buffer_matches_llama_cpp(
    model: Model, shape: dict[str, int], ctx: int, batch: int, flash: bool, measured_mib: float
):
    e = estimate(model(**shape), MemoryOptions(ctx, num_batch=batch, flash_attention=flash))
    predicted = e.cpu_compute / MiB
    assert measured_mib <= predicted * 1.005  # never under
    assert predicted <= measured_mib * 1.15


def test_flash_attention_auto_uses_the_flash_compute_buffer(model: Model):
    info = model(**SMOL)
    auto = estimate(info, MemoryOptions(2048, flash_attention=None))
    on = estimate(info, MemoryOptions(2048, flash_attention=True))
    off = estimate(info, MemoryOptions(2048, flash_attention=False))
    assert auto.cpu_compute == on.cpu_compute < off.cpu_compute
    assert auto.flash_attention
    assert on.flash_attention
    assert not off.flash_attention


def test_ubatch_follows_the_runner_batch_rules(model: Model):
    info = model(**SMALL)
    assert estimate(info, MemoryOptions(2048, num_batch=512)).n_ubatch == 512
    assert estimate(info, MemoryOptions(256, num_batch=512)).n_ubatch == 256
    embedder = model(**SMALL, pooling="mean")
    assert estimate(embedder, MemoryOptions(4096, num_batch=512)).n_ubatch == 2048


def test_gpu_graph_is_ollamas_llama_formula(model: Model):
    # engine.md §8: xllamacpp's port of Ollama's GraphSize gives 97.1 MiB full for SmolLM2 at
    # 2048 and 164.5 MiB at 8192 (batch 512).
    info = model(**SMOL, vocab=49152)
    for ctx, expected_mib in ((2048, 97.1), (8192, 164.5)):
        graph = estimate(info, MemoryOptions(ctx)).gpu_graph_full
        assert graph / MiB == pytest.approx(expected_mib, abs=0.05)


def test_total_is_everything_on_the_cpu(model: Model):
    info = model(**SMALL, vocab=1000)
    e = estimate(info, MemoryOptions(2048))
    assert e.total == (
        info.tensor_bytes + e.kv + e.cpu_compute + e.cpu_work + e.output_buffer + e.overhead
    )
    assert e.overhead > RUNNER_OVERHEAD  # plus the vocabulary
    assert e.output_buffer == 4 * 1000


# -- monotonicity --------------------------------------------------------------------------


def test_memory_grows_with_context_slots_and_batch(model: Model):
    info = model(**SMALL)
    totals = [estimate(info, MemoryOptions(c)).total for c in (256, 512, 1024, 2048, 4096)]
    assert totals == sorted(totals)
    assert len(set(totals)) == len(totals)
    slots = [estimate(info, MemoryOptions(1024, num_parallel=p)).kv for p in (1, 2, 3, 4)]
    assert slots == [slots[0] * p for p in (1, 2, 3, 4)]
    batches = [estimate(info, MemoryOptions(4096, num_batch=b)).total for b in (64, 256, 1024)]
    assert batches == sorted(batches)


def test_quantized_kv_is_smaller(model: Model):
    info = model(**SMALL)
    kv = [
        estimate(info, MemoryOptions(4096, kv_cache_type=t, flash_attention=True)).kv
        for t in ("q4_0", "q8_0", "f16", "f32")
    ]
    assert kv == sorted(kv)
    assert len(set(kv)) == 4


# -- layouts -------------------------------------------------------------------------------


@pytest.fixture
def est(model: Model) -> Estimate:
    return estimate(model(**SMALL, vocab=32000), MemoryOptions(2048))


def llama_cpp_assignment(layout: Layout, n_blocks: int) -> list[int]:
    """Per-GPU layer counts as llama.cpp derives them from n_gpu_layers and tensor_split."""
    n = layout.num_gpu_layers
    if n == 0:
        return []
    total = sum(layout.tensor_split)
    splits, acc = [], 0.0
    for share in layout.tensor_split:
        acc += share
        splits.append(acc / total)
    start = n_blocks + 1 - n
    counts = [0] * len(splits)
    for layer in range(start, n_blocks + 1):  # index n_blocks is the output layer
        counts[bisect.bisect_right(splits, (layer - start) / n)] += 1
    return counts


def roomy(e: Estimate) -> int:
    return e.gpu_graph + sum(e.layer_sizes) + e.output_weights + GiB


def test_single_gpu_full_fit(est: Estimate):
    layout = plan_layout(est, [("gpu0", roomy(est))])
    assert layout.fits_fully
    assert layout.num_gpu_layers == 9
    assert layout.gpu_layers == {"gpu0": 9}
    assert layout.vram_by_gpu == {
        "gpu0": sum(est.layer_sizes) + est.output_weights + est.gpu_graph_full
    }
    assert layout.host_bytes == (
        est.input_weights + est.cpu_compute_offloaded + est.output_buffer + est.overhead
    )
    assert layout.tensor_split == (9.0,)


def test_two_equal_gpus_share_the_layers(est: Estimate):
    layout = plan_layout(est, [("a", roomy(est)), ("b", roomy(est))])
    assert layout.fits_fully
    assert sum(layout.gpu_layers.values()) == 9
    # Balanced in bytes: the big output layer (32000-token vocabulary) counts for several.
    vram = list(layout.vram_by_gpu.values())
    assert max(vram) - min(vram) <= max(est.output_weights, max(est.layer_sizes))
    assert llama_cpp_assignment(layout, 8) == [layout.gpu_layers["a"], layout.gpu_layers["b"]]


def test_gpus_share_in_proportion_to_free_memory(model: Model):
    e = estimate(model(layers=30, embd=256, heads=4, vocab=300), MemoryOptions(2048))
    unit = sum(e.layer_sizes) + e.output_weights
    layout = plan_layout(e, [("big", e.gpu_graph + 2 * unit), ("small", e.gpu_graph + unit)])
    assert layout.fits_fully
    assert 18 <= layout.gpu_layers["big"] <= 23
    assert llama_cpp_assignment(layout, 30) == [
        layout.gpu_layers["big"],
        layout.gpu_layers["small"],
    ]


@pytest.mark.parametrize("k", [1, 3, 7])
def test_partial_offload_takes_the_last_layers(est: Estimate, k: int):
    free = est.gpu_graph + sum(est.layer_sizes[-k:]) + 1
    layout = plan_layout(est, [("gpu0", free)])
    assert layout.num_gpu_layers == k
    assert not layout.fits_fully
    assert layout.vram_by_gpu == {"gpu0": sum(est.layer_sizes[-k:]) + est.gpu_graph_partial}
    cpu_blocks = 8 - k
    assert layout.host_bytes == (
        est.input_weights
        + sum(est.layer_sizes[:cpu_blocks])
        + est.output_host_weights
        + est.cpu_compute
        + est.cpu_work
        + est.output_buffer
        + est.overhead
    )
    # Nothing is lost or counted twice: host + layers on the GPU == everything on the CPU.
    assert layout.host_bytes + layout.vram - est.gpu_graph_partial == est.total


def test_output_layer_only_with_every_block(est: Estimate):
    free = est.gpu_graph + sum(est.layer_sizes) + est.output_weights - 1
    layout = plan_layout(est, [("gpu0", free)])
    assert layout.num_gpu_layers == 8  # every block, but not the output layer
    assert not layout.fits_fully


@pytest.mark.parametrize(
    ("num_gpu", "expected"), [(0, 0), (1, 1), (5, 5), (8, 8), (9, 9), (50, 9), (-1, 9)]
)
def test_num_gpu_caps_the_layer_count(est: Estimate, num_gpu: int, expected: int):
    layout = plan_layout(est, [("gpu0", roomy(est))], num_gpu=num_gpu)
    assert layout.num_gpu_layers == expected
    assert layout.fits_fully == (expected == 9)
    if expected == 0:
        assert layout.vram_by_gpu == {}
        assert layout.host_bytes == est.total


def test_gpu_overhead_is_reserved(est: Estimate):
    exact = est.gpu_graph + sum(est.layer_sizes) + est.output_weights
    assert plan_layout(est, [("gpu0", exact)]).fits_fully
    assert not plan_layout(est, [("gpu0", exact)], gpu_overhead=1).fits_fully
    assert plan_layout(est, [("gpu0", exact + GiB)], gpu_overhead=GiB).fits_fully


@pytest.mark.parametrize(
    "gpus",
    [
        pytest.param([], id="no-gpus"),
        pytest.param([("gpu0", 0)], id="no-free-memory"),
        pytest.param([("gpu0", 10 * MiB), ("gpu1", 10 * MiB)], id="smaller-than-the-graph"),
    ],
)
def test_nothing_fits_runs_on_the_cpu(est: Estimate, gpus: list[tuple[str, int]]):
    layout = plan_layout(est, gpus)
    assert layout.num_gpu_layers == 0
    assert layout.gpu_layers == {}
    assert layout.vram_by_gpu == {}
    assert layout.tensor_split == ()
    assert not layout.fits_fully
    assert layout.host_bytes == layout.total == est.total
    assert layout.usage.total == est.total
    assert layout.usage.vram == 0


def test_more_free_memory_never_offloads_fewer_layers(est: Estimate):
    step = max(est.layer_sizes) // 3
    counts = [
        plan_layout(
            est, [("a", est.gpu_graph + i * step), ("b", est.gpu_graph + i * step // 2)]
        ).num_gpu_layers
        for i in range(0, 40)
    ]
    assert counts == sorted(counts)
    assert counts[0] == 0
    assert counts[-1] == 9


def test_layout_usage_reports_host_plus_devices(est: Estimate):
    layout = plan_layout(est, [("a", roomy(est)), ("b", roomy(est))])
    usage = layout.usage
    assert usage.vram_by_gpu == layout.vram_by_gpu
    assert usage.total == layout.host_bytes + sum(layout.vram_by_gpu.values())


# -- speed ---------------------------------------------------------------------------------


def test_prediction_is_fast(model: Model):
    info = model(**SMOL, vocab=49152)  # 273 tensors, like SmolLM2
    assert len(info.tensors) > 250
    profile(info)  # the header is summed once; later calls reuse it
    assert profile(info) is profile(info)
    runs = 200
    started = time.perf_counter()
    for i in range(runs):
        e = estimate(info, MemoryOptions(1024 + i, num_parallel=1 + i % 4))
        plan_layout(e, [("a", 80 * MiB), ("b", 120 * MiB)])
    per_call = (time.perf_counter() - started) / runs
    assert per_call < 1e-3


def test_tensor_split_skips_gpus_without_layers(est: Estimate):
    gpus = [("a", roomy(est)), ("full", 0), ("c", roomy(est))]
    layout = plan_layout(est, gpus)
    assert layout.fits_fully
    assert list(layout.gpu_layers) == ["a", "c"]
    assert layout.tensor_split == tuple(float(n) for n in layout.gpu_layers.values())
    assert llama_cpp_assignment(layout, 8) == list(layout.gpu_layers.values())
