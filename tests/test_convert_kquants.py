"""K-quant targets (``q4_K_M``, ``q4_K_S``) made by ggml in the engine's library
(convert/ggml_quants.py): the type Ollama's rules give each tensor, ggml's bytes beside
numpy's, the refusal where the library is absent, and a tiny model quantized whole.
tests/test_convert_runner.py loads a K-quantized SmolLM2 in llama.cpp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, quantize

from ollamatrio.convert import ggml_quants, rows
from ollamatrio.convert.policy import ModelShape, TypePlanner, parse_target, tensor_type
from ollamatrio.convert.quantize import quantize_gguf
from ollamatrio.errors import InvalidRequestError
from ollamatrio.gguf import read_gguf

T = GGMLQuantizationType
Q4KM = parse_target("q4_K_M")
Q4KS = parse_target("Q4_K_S")
Q4 = parse_target("q4_0")
Q8 = parse_target("q8_0")


def _layers(n: int) -> list[str]:
    names = ["token_embd.weight"]
    for i in range(n):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up"):
            names.append(f"blk.{i}.{part}.weight")
        names.append(f"blk.{i}.ffn_down.weight")
    return [*names, "output_norm.weight", "output.weight"]


def _plan(target: Any, layers: int, width: int = 512) -> dict[str, GGMLQuantizationType]:
    names = _layers(layers)
    planner = TypePlanner(target, ModelShape.of(names, architecture="llama"))
    return {n: planner.type_of(n, (width, width), T.F16) for n in names}


def test_q4_k_m_gives_more_bits_to_some_value_and_down_projections() -> None:
    """llama.cpp's use_more_bits over 32 layers: the first 4, the last 4, and every third
    between (6, 9, ..., 27) get Q6_K for attn_v and ffn_down; the output Q6_K."""
    types = _plan(Q4KM, 32)
    more = [i for i in range(32) if types[f"blk.{i}.attn_v.weight"] == T.Q6_K]
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert more == [i for i in range(32) if types[f"blk.{i}.ffn_down.weight"] == T.Q6_K]
    others = {types[f"blk.{i}.attn_v.weight"] for i in range(32) if i not in more}
    assert others == {T.Q4_K}
    assert {types[f"blk.{i}.attn_q.weight"] for i in range(32)} == {T.Q4_K}
    assert types["output.weight"] == T.Q6_K
    assert types["token_embd.weight"] == T.Q4_K


def test_q4_k_s_gives_q5_k_to_the_first_layers() -> None:
    types = _plan(Q4KS, 32)
    assert [types[f"blk.{i}.attn_v.weight"] for i in range(6)] == [T.Q5_K] * 4 + [T.Q4_K] * 2
    assert [types[f"blk.{i}.ffn_down.weight"] for i in range(6)] == [T.Q5_K] * 4 + [T.Q4_K] * 2
    assert types["output.weight"] == T.Q6_K


@pytest.mark.parametrize(
    ("name", "shape", "target", "model", "expected"),
    [
        ("blk.0.attn_q.weight", (576, 576), Q4KM, ModelShape(True), T.Q5_0),  # 576 % 256
        ("blk.0.attn_v.weight", (576, 192), Q4KM, ModelShape(True, 0, "", 30), T.Q8_0),
        ("blk.0.attn_q.weight", (48, 64), Q4KM, ModelShape(True), T.F16),  # nor Q5_0
        ("output.weight", (576, 300), Q4KM, ModelShape(True), T.Q8_0),
        ("token_embd.weight", (512, 300), Q4KM, ModelShape(False), T.Q6_K),  # tied
        ("output.weight", (512, 300), Q4, ModelShape(True), T.Q6_K),  # as Ollama
        ("output.weight", (512, 300), Q8, ModelShape(True), T.Q8_0),
        ("blk.0.attn_output.weight", (512, 512), Q4KS, ModelShape(True, 8), T.Q5_K),
        ("blk.0.attn_v.weight", (512, 64), Q4KM, ModelShape(True, 8, "", 4), T.Q8_0),
        ("blk.0.attn_qkv.weight", (512, 1536), Q4KM, ModelShape(True), T.Q5_K),
        ("blk.0.attn_q_a.weight", (512, 512), Q4KM, ModelShape(True), T.Q8_0),  # MLA
        ("blk.0.ssm_out.weight", (512, 512), Q4KM, ModelShape(True, 0, "qwen3next"), T.Q4_K),
        ("blk.0.attn_v.weight", (512, 64), Q4KS, ModelShape(True, 0, "qwen35"), T.Q6_K),
    ],
)
def test_k_mix_types(name: str, shape: Any, target: Any, model: Any, expected: Any) -> None:
    assert tensor_type(name, shape, T.F16, target, model) == expected


def test_without_k_quants_the_output_of_a_legacy_target_is_q8_0() -> None:
    model = ModelShape(True)
    assert tensor_type("output.weight", (512, 9), T.F16, Q4, model, k_quants=False) == T.Q8_0


def test_q4_k_is_q4_k_m() -> None:
    assert parse_target("q4_k") is Q4KM


def test_without_the_engine_library_k_quants_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The library not found (as on a machine without the engine): a 400 naming the types
    numpy makes; the legacy types still quantize (numpy)."""
    monkeypatch.setattr(ggml_quants, "_engine_library", lambda: None)
    ggml_quants.ggml_quantizer.cache_clear()
    try:
        with pytest.raises(InvalidRequestError) as caught:
            parse_target("q4_K_M")
        assert str(caught.value) == (
            "unsupported quantization type Q4_K_M - supported types are "
            "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1"
        )
        x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
        made = rows.made(rows.encode(lambda a, b: x[a:b], 4, 64, T.Q4_0))
        assert made.tobytes() == quantize(x, T.Q4_0).tobytes()
    finally:
        ggml_quants.ggml_quantizer.cache_clear()


def _quantizer() -> ggml_quants.GGMLQuantizer:
    quantizer = ggml_quants.ggml_quantizer()
    assert quantizer is not None, "the engine library's ggml_quantize_chunk"
    return quantizer


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1])
def test_ggml_makes_numpys_bytes(qtype: GGMLQuantizationType) -> None:
    x = np.random.default_rng(3).standard_normal((16, 512)).astype(np.float32) * 3
    assert _quantizer().quantize(x, qtype).tobytes() == quantize(x, qtype).tobytes()


@pytest.mark.parametrize(("qtype", "tolerance"), [(T.Q4_K, 0.35), (T.Q5_K, 0.18), (T.Q6_K, 0.09)])
def test_k_quants_round_trip(qtype: GGMLQuantizationType, tolerance: float) -> None:
    """ggml's K-quant bytes read back by the ``gguf`` package's decoder, close."""
    x = np.random.default_rng(4).standard_normal((8, 512)).astype(np.float32)
    made = _quantizer().quantize(x, qtype)
    assert made.shape == (8, 512 // 256 * ggml_quants.GGML_QUANT_SIZES[qtype][1])
    back = dequantize(made, qtype).reshape(x.shape)
    assert np.abs(back - x).max() < tolerance


def test_ggml_refuses_rows_not_in_blocks() -> None:
    """Checked before the call: ggml would abort the process on it."""
    with pytest.raises(ValueError, match="not whole Q4_K blocks"):
        _quantizer().quantize(np.zeros((2, 320), np.float32), T.Q4_K)
    with pytest.raises(ValueError, match="2-D"):
        _quantizer().quantize(np.zeros(256, np.float32), T.Q4_K)


def test_quantize_a_tiny_model_to_q4_k_m(tiny_gguf: Any, tmp_path: Path) -> None:
    source = tiny_gguf(dtype="f16", embd=256, heads=4, ff=512, layers=8)
    out = tmp_path / "out.gguf"
    list(quantize_gguf(source, out, Q4KM))
    info = read_gguf(out, cache=False)
    assert info.file_type_name == "Q4_K_M"
    got = {t.name: t.type for t in info.tensors}
    # 8 layers: use_more_bits is layers 0, 3 (8//8 + 2), 6 and 7.
    assert [got[f"blk.{i}.ffn_down.weight"] for i in range(8)] == [
        T.Q6_K if i in (0, 3, 6, 7) else T.Q4_K for i in range(8)
    ]
    assert got["blk.0.attn_q.weight"] == T.Q4_K
    assert got["output.weight"] == T.Q6_K
    assert got["blk.0.attn_norm.weight"] == T.F32
    before = {t.name: t for t in GGUFReader(source).tensors}
    after = {t.name: t for t in GGUFReader(out).tensors}
    for name in ("blk.1.attn_k.weight", "blk.0.ffn_down.weight", "output.weight"):
        want = dequantize(np.asarray(before[name].data), T.F16).reshape(-1)
        have = dequantize(np.asarray(after[name].data), got[name]).reshape(-1)
        assert np.abs(want - have).max() < 0.1 * np.abs(want).max(), name
