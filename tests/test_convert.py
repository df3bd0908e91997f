"""Quantizing a float GGUF and converting a Hugging Face safetensors folder (convert/),
checked on generated files: the type each tensor gets, the values it keeps, the header the
result carries, and the refusals.  tests/test_convert_runner.py loads the results in
llama.cpp."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, quantize

from ollamatrio.convert import hf_llama, hf_tokenizer, rows
from ollamatrio.convert.policy import ModelShape, parse_target, tensor_type
from ollamatrio.convert.quantize import quantize_gguf
from ollamatrio.errors import InvalidRequestError
from ollamatrio.gguf import read_gguf
from ollamatrio.store import ModelStore, create_model, import_gguf
from ollamatrio.testing.tiny_hf import (
    tokenizer_from_vocabulary,
    write_safetensors,
    write_tiny_hf,
)

T = GGMLQuantizationType
Q4 = parse_target("q4_0")
Q8 = parse_target("Q8_0")
F16 = parse_target("f16")
TIED = ModelShape(has_output=False)
UNTIED = ModelShape(has_output=True)


@pytest.mark.parametrize(
    ("name", "shape", "current", "target", "model", "expected"),
    [
        ("blk.0.attn_q.weight", (64, 64), T.F16, Q4, UNTIED, T.Q4_0),
        ("blk.0.attn_q.weight", (64, 64), T.BF16, Q8, UNTIED, T.Q8_0),
        ("blk.0.attn_norm.weight", (64,), T.F32, Q4, UNTIED, T.F32),  # 1-D
        ("blk.0.attn_q.bias", (64, 2), T.F32, Q4, UNTIED, T.F32),  # not a weight
        ("blk.0.ffn_gate_inp.weight", (64, 8), T.F16, Q4, UNTIED, T.F16),  # a router
        ("position_embd.weight", (64, 64), T.F32, Q4, UNTIED, T.F32),
        ("v.blk.0.attn_q.weight", (64, 64), T.F16, Q4, UNTIED, T.F16),  # a vision tower
        ("token_embd.weight", (64, 300), T.F16, Q4, UNTIED, T.Q4_0),
        ("token_embd.weight", (64, 300), T.F16, Q4, TIED, T.Q8_0),  # it is the output too
        ("output.weight", (64, 300), T.F16, Q4, UNTIED, T.Q8_0),  # Ollama's Q6_K
        ("output.weight", (48, 300), T.F16, Q4, UNTIED, T.F16),  # rows not in blocks
        ("blk.0.ffn_down.weight", (48, 64), T.F32, Q8, UNTIED, T.F16),
        ("blk.0.attn_v.weight", (64, 16), T.F16, Q4, ModelShape(True, 8), T.Q8_0),
        ("blk.0.attn_v.weight", (64, 16), T.F16, Q4, ModelShape(True, 4), T.Q4_0),
        ("blk.0.attn_q.weight", (48, 64), T.F32, F16, UNTIED, T.F16),  # floats: no blocks
        ("output.weight", (64, 300), T.F32, F16, UNTIED, T.F16),
        ("blk.0.attn_q.weight", (64, 64), T.Q8_0, Q4, UNTIED, T.Q8_0),  # left as it is
    ],
)
def test_tensor_types(
    name: str, shape: tuple[int, ...], current: Any, target: Any, model: Any, expected: Any
) -> None:
    assert tensor_type(name, shape, current, target, model) == expected


@pytest.mark.parametrize("name", ["q6_K", "Q5_K_M", "IQ2_XS", "nonsense"])
def test_unsupported_targets_are_refused_with_the_supported_list(name: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        parse_target(name)
    assert str(caught.value) == (
        f"unsupported quantization type {name.upper()} - supported types are "
        "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K_S, Q4_K_M"
    )


def test_slices_encode_as_the_whole_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor encoded a few rows at a time is byte for byte the tensor encoded whole."""
    x = np.random.default_rng(1).standard_normal((37, 96)).astype(np.float32)
    monkeypatch.setattr(rows, "SLICE_ELEMENTS", 5 * 96)
    for qtype in (T.Q8_0, T.Q4_1, T.Q5_0, T.F16, T.BF16):  # ggml's and numpy's bytes agree
        sliced = rows.made(rows.encode(lambda a, b: x[a:b], 37, 96, qtype))
        assert sliced.tobytes() == quantize(x, qtype).tobytes(), qtype.name


def test_bf16_widens_exactly() -> None:
    x = np.array([1.0, -2.5, 3.140625, 2.0**-100, -0.0], np.float32)  # bf16 values
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
    assert rows.widen_bf16(bits).tolist() == x.tolist()


def _tensors(path: Path) -> dict[str, Any]:
    return {t.name: t for t in GGUFReader(path).tensors}


def _values(t: Any) -> np.ndarray[Any, Any]:
    return dequantize(np.asarray(t.data), T(t.tensor_type)).reshape(-1)


@pytest.mark.parametrize("target", ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "f16", "bf16"])
def test_quantize_a_tiny_model(tiny_gguf: Any, tmp_path: Path, target: str) -> None:
    """embd 48 is not a whole number of 32-value blocks: those matrices go to F16, the
    feed-forward's down projection (rows of 96) takes the target; norms stay F32; the
    header says the new file type; the values stay close to the source's."""
    source = tiny_gguf(dtype="f32", embd=48, heads=4, ff=96)
    out = tmp_path / "out.gguf"
    steps = list(quantize_gguf(source, out, parse_target(target)))
    assert steps[-1].done == steps[-1].total == read_gguf(source).tensor_bytes
    info = read_gguf(out, cache=False)
    assert info.file_type_name == target.upper()
    want = T[target.upper()]
    quantized = want not in (T.F16, T.BF16)
    got = {t.name: t.type for t in info.tensors}
    assert got["blk.0.ffn_down.weight"] == want
    assert got["blk.0.attn_q.weight"] == (T.F16 if quantized else want)
    assert got["output.weight"] == (T.F16 if quantized else want)
    assert got["blk.0.attn_norm.weight"] == T.F32
    before, after = _tensors(source), _tensors(out)
    tolerance = {"q8_0": 2e-3, "f16": 1e-4, "bf16": 1e-3}.get(target, 2e-2)
    for name in ("blk.0.ffn_down.weight", "blk.1.attn_k.weight", "token_embd.weight"):
        assert np.abs(_values(before[name]) - _values(after[name])).max() < tolerance, name
    assert (
        info.metadata["tokenizer.ggml.tokens"]
        == read_gguf(source).metadata["tokenizer.ggml.tokens"]
    )


def _upload(store: ModelStore, files: dict[str, Path]) -> dict[str, str]:
    digests = {}
    for name, path in files.items():
        data = path.read_bytes()
        digests[name] = "sha256:" + hashlib.sha256(data).hexdigest()
        store.write_blob(digests[name], [data])
    return digests


def test_quantize_through_create_from_a_model(store: ModelStore, tiny_gguf: Any) -> None:
    list(import_gguf(store, "base", tiny_gguf(dtype="f16")))
    events = list(create_model(store, "small", from_model="base", quantize="q4_1"))
    lines = [e for e in events if e["status"] == "quantizing F16 model to Q4_1"]
    assert lines, events
    assert all(e["digest"] == "0000000000000000000" for e in lines)
    model_layer = store.resolve("base").manifest.layers[0]
    assert lines[-1]["completed"] == lines[-1]["total"] == model_layer.size
    assert "verifying conversion" in [e["status"] for e in events]
    small, base = store.resolve("small"), store.resolve("base")
    assert small.details.quantization_level == "Q4_1"
    assert small.size < base.size
    assert small.template == base.template
    again = list(create_model(store, "same", from_model="base", quantize="F16"))
    assert not any("quantizing" in e["status"] for e in again)  # already F16: kept
    with pytest.raises(InvalidRequestError, match="only supported for F16, BF16 and F32"):
        list(create_model(store, "twice", from_model="small", quantize="q8_0"))


def test_a_create_left_mid_tensor_leaves_nothing(
    store: ModelStore, tiny_gguf: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The create yields between slices of a tensor, so a client that leaves stops the
    work there (the worker thread finishes one slice, not one tensor); closing it then
    leaves no blob and no temporary file."""
    list(import_gguf(store, "base", tiny_gguf(dtype="f32", vocab=4000)))
    before = set(store.blobs_dir.iterdir())
    monkeypatch.setattr(rows, "SLICE_ELEMENTS", 64 * 100)  # 100 rows of the embeddings
    events = create_model(store, "small", from_model="base", quantize="q8_0")
    for event in events:
        if event.get("completed", 0) > 0:
            break
    first = event["completed"]
    assert 0 < first < store.resolve("base").manifest.layers[0].size / 10
    events.close()  # type: ignore[attr-defined]
    assert set(store.blobs_dir.iterdir()) == before
    assert not store.exists("small")


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


def test_permutation_interleaves_the_rotary_halves() -> None:
    """Per head, HF stores the rotary pairs as (first half, second half); llama.cpp wants
    them side by side: rows 0 1 2 3 of a 4-row head become 0 2 1 3."""
    w = np.arange(16, dtype=np.float32).reshape(8, 2)  # 2 heads of 4 rows
    out = hf_llama.permute_rows(w, heads=2)
    assert out[:, 0].tolist() == [0, 4, 2, 6, 8, 12, 10, 14]


@pytest.mark.parametrize(
    ("pre_tokenizer", "expected"),
    [
        ({"type": "ByteLevel", "use_regex": True}, "gpt-2"),
        (
            {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": True},
                {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
            ]},
            "smollm",
        ),
        (None, "default"),
    ],
)  # fmt: skip
def test_pre_tokenizer_names(pre_tokenizer: Any, expected: str) -> None:
    tok = tokenizer_from_vocabulary().tokenizer_json()
    tok["pre_tokenizer"] = pre_tokenizer
    md = hf_tokenizer.tokenizer_metadata(tok, {}, {}, None, 300)
    assert md["tokenizer.ggml.pre"].value == expected


@pytest.mark.parametrize(
    ("architecture", "dtype", "arch"),
    [
        ("LlamaForCausalLM", "f32", "llama"),
        ("MistralForCausalLM", "bf16", "llama"),
        ("Qwen2ForCausalLM", "f16", "qwen2"),
    ],
)
def test_safetensors_folder_to_gguf(
    store: ModelStore, tmp_path: Path, architecture: str, dtype: Any, arch: str
) -> None:
    tokenizer = tokenizer_from_vocabulary()
    files = write_tiny_hf(tmp_path / "hf", tokenizer, architecture=architecture, dtype=dtype)
    events = list(create_model(store, "imported", files=_upload(store, files)))
    assert events[0] == {"status": "converting model"}
    assert events[-1] == {"status": "success"}
    model = store.resolve("imported")
    assert model.details.family == arch
    assert model.details.quantization_level == ("BF16" if dtype == "bf16" else "F16")
    assert model.model_path is not None
    info = read_gguf(model.model_path, cache=False)
    assert info.metadata["tokenizer.ggml.model"] == "gpt2"
    assert info.metadata["tokenizer.ggml.eos_token_id"] == tokenizer.eos
    assert info.chat_template == tokenizer.chat_template
    assert info.vocab_size == 300
    assert info.block_count == 2
    assert info.head_count_kv == 2
    got = {t.name: t for t in GGUFReader(model.model_path).tensors}
    assert set(got) >= {"token_embd.weight", "output.weight", "output_norm.weight"}
    assert ("blk.0.attn_q.bias" in got) == (arch == "qwen2")
    q = _values(got["blk.0.attn_q.weight"]).reshape(64, 64)
    original = _read_hf(files, "model.layers.0.self_attn.q_proj.weight")
    expected = hf_llama.permute_rows(original, 4) if arch == "llama" else original
    assert np.abs(q - expected).max() < 2e-3


def _read_hf(files: dict[str, Path], name: str) -> np.ndarray[Any, Any]:
    from ollamatrio.convert.safetensors import read_header

    for shown, path in files.items():
        if shown.endswith(".safetensors"):
            for t in read_header(path, shown):
                if t.name == name:
                    with open(path, "rb") as f:
                        f.seek(t.offset)
                        raw = f.read(t.n_elements * (4 if t.dtype == "F32" else 2))
                    if t.dtype == "F32":
                        return np.frombuffer(raw, np.float32).reshape(t.shape)
                    if t.dtype == "F16":
                        return np.frombuffer(raw, np.float16).astype(np.float32).reshape(t.shape)
                    return rows.widen_bf16(np.frombuffer(raw, np.uint16)).reshape(t.shape)
    raise KeyError(name)


def test_safetensors_import_quantized_in_one_create(store: ModelStore, tmp_path: Path) -> None:
    """``quantize`` with ``files``: converted, then quantized; the intermediate F16 file
    does not stay in the store."""
    files = write_tiny_hf(tmp_path / "hf", tokenizer_from_vocabulary(), tie_embeddings=True)
    uploads = _upload(store, files)
    events = list(create_model(store, "q", files=uploads, quantize="q8_0"))
    statuses = [e["status"] for e in events]
    assert statuses[0] == "converting model"
    assert "quantizing F16 model to Q8_0" in statuses
    model = store.resolve("q")
    assert model.details.quantization_level == "Q8_0"
    assert model.model_path is not None
    types = {t.name: t.type for t in read_gguf(model.model_path).tensors}
    assert "output.weight" not in types
    assert types["token_embd.weight"] == T.Q8_0
    kept = {p.name for p in store.blobs_dir.iterdir()}
    referenced = {layer.digest.replace(":", "-") for layer in model.manifest.layers}
    assert model.manifest.config is not None
    referenced.add(model.manifest.config.digest.replace(":", "-"))
    assert kept == referenced | {d.replace(":", "-") for d in uploads.values()}


def _refusal(store: ModelStore, files: dict[str, Path]) -> str:
    """The 400 ``files`` get when the create is validated, before its first line."""
    uploads = _upload(store, files)
    with pytest.raises(InvalidRequestError) as caught:
        create_model(store, "x", files=uploads)
    assert not store.exists("x")
    return str(caught.value)


def test_safetensors_refusals(store: ModelStore, tmp_path: Path) -> None:
    files = write_tiny_hf(tmp_path / "hf", tokenizer_from_vocabulary())
    config = json.loads(files["config.json"].read_text())

    def with_config(**changes: Any) -> dict[str, Path]:
        path = tmp_path / "config.json"
        path.write_text(json.dumps({**config, **changes}))
        return {**files, "config.json": path}

    message = _refusal(store, with_config(architectures=["GPT2LMHeadModel"]))
    assert message.startswith('unsupported architecture "GPT2LMHeadModel"')
    assert "LlamaForCausalLM" in message
    assert "tokenizer.json is required" in _refusal(
        store, {k: v for k, v in files.items() if k != "tokenizer.json"}
    )
    assert "config.json is required" in _refusal(
        store, {k: v for k, v in files.items() if k != "config.json"}
    )
    assert "num_hidden_layers" in _refusal(store, with_config(num_hidden_layers="2"))
    spm = json.loads(files["tokenizer.json"].read_text())
    spm["model"]["byte_fallback"] = True
    (tmp_path / "tokenizer.json").write_text(json.dumps(spm))
    assert "SentencePiece" in _refusal(
        store, {**files, "tokenizer.json": tmp_path / "tokenizer.json"}
    )
    shard = files["model-00001-of-00002.safetensors"]
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(shard.read_bytes()[:-10])
    assert "do not match its shape" in _refusal(
        store, {**files, "model-00001-of-00002.safetensors": broken}
    )
    extra = tmp_path / "extra.safetensors"
    write_safetensors(extra, {"model.vision_tower.weight": (np.zeros((2, 2), np.float32), "F32")})
    assert "cannot convert tensor 'model.vision_tower.weight'" in _refusal(
        store, {**files, "extra.safetensors": extra}
    )


LLAMA_31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _reference_rope_factors(base: float, dim: int) -> list[float]:
    """``convert_hf_to_gguf.py``'s loop for Llama 3.1's factors, as written there."""
    s = LLAMA_31_ROPE
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi / (1.0 / base ** (i / dim))
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"]
            )
            out.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return out


def test_llama_3_1_rope_factors(store: ModelStore, tmp_path: Path) -> None:
    """Llama 3.1's config (``rope_type: llama3``, Llama-3.1-8B's theta and head size):
    the factors llama.cpp reads come out as ``convert_hf_to_gguf.py`` makes them, and an
    imported model carries them as ``rope_freqs.weight``."""
    config = {"rope_theta": 500000.0, "rope_scaling": LLAMA_31_ROPE}
    hp = hf_llama.Hyperparameters("llama", layers=32, embd=4096, heads=32, kv_heads=8,
                                  vocab_size=128256)  # fmt: skip
    factors = hf_llama.rope_factors(config, hp)
    assert factors is not None
    expected = _reference_rope_factors(500000.0, 128)
    assert np.allclose(factors, expected, rtol=1e-6)
    assert factors[0] == 1.0
    assert factors[-1] == 8.0
    assert ((factors > 1.0) & (factors < 8.0)).any()  # the smoothed band between
    files = write_tiny_hf(tmp_path / "hf", tokenizer_from_vocabulary(), config_extra=config)
    list(create_model(store, "llama31", files=_upload(store, files)))
    path = store.resolve("llama31").model_path
    assert path is not None
    got = {t.name: t for t in GGUFReader(path).tensors}
    stored = np.asarray(got["rope_freqs.weight"].data).reshape(-1)
    assert np.allclose(stored, _reference_rope_factors(500000.0, 16), rtol=1e-6)
    with pytest.raises(InvalidRequestError, match='unsupported rope scaling "yarn"'):
        hf_llama.model_metadata({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, hp)


def test_token_ids_keep_their_places() -> None:
    """An id no token has (added tokens often start past a gap) and the embedding's
    spare rows become unused ``[PAD<id>]`` tokens: every token stays at its own id."""
    tok = tokenizer_from_vocabulary().tokenizer_json()
    tok["added_tokens"] = [{"id": 302, "content": "<|extra|>", "special": True}]
    md = hf_tokenizer.tokenizer_metadata(tok, {"eos_token": "<|extra|>"}, {}, None, 305)
    tokens, types = md["tokenizer.ggml.tokens"].value, md["tokenizer.ggml.token_type"].value
    assert len(tokens) == 305
    assert tokens[300:] == ["[PAD300]", "[PAD301]", "<|extra|>", "[PAD303]", "[PAD304]"]
    assert types[300:] == [5, 5, 3, 5, 5]  # unused, control
    assert md["tokenizer.ggml.eos_token_id"].value == 302
