"""The test-model generator: vocabularies, weights, sparse files, corrupt variants and the CLI."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

from ollamatrio.gguf import read_gguf
from ollamatrio.testing import CHATML, write_tiny_gguf
from ollamatrio.testing.__main__ import main as cli_main
from ollamatrio.testing.vocab import build_vocabulary, min_vocab_size

TinyGGUF = Callable[..., Path]  # the tiny_gguf fixture's factory


def field(reader: gguf.GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


@pytest.mark.parametrize("vocab", [259, 300, 4000])
def test_spm_vocabulary(tiny_gguf: TinyGGUF, vocab: int) -> None:
    reader = gguf.GGUFReader(tiny_gguf(vocab=vocab, tokenizer="llama"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list)
    assert len(tokens) == vocab
    assert len(set(tokens)) == vocab
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[3:259] == [f"<0x{b:02X}>" for b in range(256)]  # byte fallback
    assert field(reader, "tokenizer.ggml.model") == "llama"
    assert len(field(reader, "tokenizer.ggml.scores")) == vocab  # type: ignore[arg-type]
    types = field(reader, "tokenizer.ggml.token_type")
    assert types[:3] == [2, 3, 3]  # type: ignore[index]
    assert set(types[3:259]) == {6}  # type: ignore[index]
    assert reader.fields["tokenizer.ggml.token_type"].types == [
        gguf.GGUFValueType.ARRAY,
        gguf.GGUFValueType.INT32,
    ]
    assert (
        field(reader, "tokenizer.ggml.bos_token_id"),
        field(reader, "tokenizer.ggml.eos_token_id"),
    ) == (1, 2)


@pytest.mark.parametrize("vocab", [263, 300, 4000])
def test_bpe_vocabulary(tiny_gguf: TinyGGUF, vocab: int) -> None:
    reader = gguf.GGUFReader(tiny_gguf(vocab=vocab, tokenizer="gpt2"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert isinstance(tokens, list)
    assert len(tokens) == len(set(tokens)) == vocab
    assert len(set(tokens[:256])) == 256
    assert all(len(t) == 1 for t in tokens[:256])  # the byte symbols
    assert tokens[-2:] == ["<|endoftext|>", "<|pad|>"]
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "default"
    merges = field(reader, "tokenizer.ggml.merges")
    assert isinstance(merges, list)
    for merge in merges:  # every merge's result is a token
        left, right = merge.split(" ")
        assert left + right in tokens
    assert "tokenizer.ggml.scores" not in reader.fields
    assert field(reader, "tokenizer.ggml.eos_token_id") == vocab - 2


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_vocabulary_too_small(kind: str) -> None:
    with pytest.raises(ValueError, match="at least"):
        build_vocabulary(kind, min_vocab_size(kind) - 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0", "q4_0"])
def test_dense_weights(tiny_gguf: TinyGGUF, dtype: str) -> None:
    reader = gguf.GGUFReader(tiny_gguf(dtype=dtype))
    tensors = {t.name: t for t in reader.tensors}
    norm = gguf.dequantize(tensors["blk.0.attn_norm.weight"].data, gguf.GGMLQuantizationType.F32)
    assert np.all(norm == 1.0)
    t = tensors["blk.1.ffn_up.weight"]
    weights = gguf.dequantize(t.data, t.tensor_type)
    assert weights.shape == (128, 64)
    assert np.all(np.isfinite(weights))
    assert 0.01 < float(weights.std()) < 0.03  # N(0, 0.02), quantised


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path) -> None:
    a = write_tiny_gguf(tmp_path / "a.gguf", seed=1).read_bytes()
    b = write_tiny_gguf(tmp_path / "b.gguf", seed=1).read_bytes()
    c = write_tiny_gguf(tmp_path / "c.gguf", seed=2).read_bytes()
    assert a == b
    assert len(a) == len(c)
    assert a != c


def test_chat_template_and_name(tiny_gguf: TinyGGUF) -> None:
    assert read_gguf(tiny_gguf()).chat_template == CHATML
    assert read_gguf(tiny_gguf(chat_template=None)).chat_template is None
    custom = read_gguf(tiny_gguf(chat_template="{{ messages }}", name="other"))
    assert custom.chat_template == "{{ messages }}"
    assert custom.name == "other"


def test_extra_metadata_adds_overrides_and_deletes(tiny_gguf: TinyGGUF) -> None:
    info = read_gguf(
        tiny_gguf(
            extra_metadata={
                "llama.context_length": 131072,
                "llama.vocab_size": None,
                "custom.flag": True,
                "custom.scale": 0.5,
                "custom.offset": -3,
                "custom.big": 1 << 40,
                "custom.tags": ["a", "b"],
            }
        )
    )
    assert info.context_length == 131072
    assert "llama.vocab_size" not in info.metadata
    assert info.metadata["custom.flag"] is True
    assert info.metadata["custom.scale"] == 0.5
    assert info.metadata["custom.offset"] == -3
    assert info.metadata["custom.big"] == 1 << 40
    assert info.metadata["custom.tags"] == ["a", "b"]


def test_sparse_file_takes_no_disk(tiny_gguf: TinyGGUF) -> None:
    path = tiny_gguf(
        sparse=True, layers=22, embd=2048, heads=32, kv_heads=4, ff=5632, vocab=32000, dtype="f16"
    )
    info = read_gguf(path)
    stat = path.stat()
    assert stat.st_size > 2 * 10**9
    assert stat.st_blocks * 512 < 8 * 2**20
    assert info.data_offset + sum(-(-t.nbytes // 32) * 32 for t in info.tensors) == stat.st_size
    with path.open("rb") as f:  # the weights read back as zeros
        f.seek(info.data_offset + info.tensor("blk.10.ffn_up.weight").offset)  # type: ignore[union-attr]
        assert f.read(4096) == bytes(4096)


def test_bad_magic(tiny_gguf: TinyGGUF) -> None:
    good, bad = tiny_gguf().read_bytes(), tiny_gguf(corrupt="bad_magic").read_bytes()
    assert bad[:4] != b"GGUF"
    assert bad[4:] == good[4:]


def test_truncated_cuts_inside_tensor_data(tiny_gguf: TinyGGUF) -> None:
    info = read_gguf(tiny_gguf())
    size = tiny_gguf(corrupt="truncated").stat().st_size
    assert info.data_offset < size < info.file_size


def test_absurd_counts(tiny_gguf: TinyGGUF) -> None:
    header = tiny_gguf(corrupt="absurd_counts").read_bytes()[:24]
    magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", header)
    assert (magic, version) == (b"GGUF", 3)
    assert n_tensors == n_kv == 1 << 60


@pytest.mark.parametrize("tokenizer", ["llama", "gpt2"])
def test_duplicate_tokens_is_otherwise_valid(tiny_gguf: TinyGGUF, tokenizer: str) -> None:
    path = tiny_gguf(corrupt="duplicate_tokens", tokenizer=tokenizer)
    info = read_gguf(path)  # structurally fine: only llama.cpp's vocab loader objects
    assert info.vocab_size == 300
    tokens = field(gguf.GGUFReader(path), "tokenizer.ggml.tokens")
    assert isinstance(tokens, list)
    assert len(tokens) == 300
    assert len(set(tokens)) == 299
    assert tokens[-1] == tokens[-2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(embd=60, heads=8), "multiple of heads"),
        (dict(heads=4, kv_heads=3), "multiple of kv_heads"),
        (dict(dtype="q4_0", embd=48, heads=4), "multiples of 32"),
        (dict(dtype="q8_0", ff=100), "multiples of 32"),
        (dict(layers=0), "positive"),
        (dict(dtype="q5_k"), "unknown dtype"),
        (dict(corrupt="scrambled"), "unknown corruption"),
        (dict(pooling="max"), "unknown pooling"),
        (dict(tokenizer="bert"), "unknown tokenizer"),
        (dict(vocab=100), "at least 259"),
        (dict(extra_metadata={"general.architecture": "bert"}), "always 'llama'"),
        (dict(extra_metadata={"custom.empty": []}), "cannot store"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_arguments(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_tiny_gguf(tmp_path / "x.gguf", **kwargs)


def test_cli_prints_declared_and_disk_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.gguf"
    argv = [str(out), "--layers", "3", "--embd", "256", "--ff", "512", "--heads", "8"]
    assert (
        cli_main([*argv, "--kv-heads", "2", "--dtype", "q8_0", "--sparse", "--pooling", "cls"]) == 0
    )
    printed = capsys.readouterr().out
    size = out.stat().st_size
    assert f"{size} bytes declared" in printed
    assert f"{out.stat().st_blocks * 512} bytes on disk" in printed
    info = read_gguf(out)
    assert (info.block_count, info.embedding_length, info.head_count_kv) == (3, 256, 2)
    assert info.pooling_type == gguf.PoolingType.CLS


def test_cli_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.gguf"
    assert (
        cli_main([str(out), "--no-chat-template", "--tokenizer", "gpt2", "--corrupt", "truncated"])
        == 0
    )
    capsys.readouterr()
    with out.open("rb") as f:
        assert f.read(4) == b"GGUF"
    assert cli_main([str(out), "--no-chat-template", "--tokenizer", "gpt2"]) == 0
    info = read_gguf(out)
    assert info.chat_template is None
    assert info.metadata["tokenizer.ggml.model"] == "gpt2"


def test_cli_rejects_bad_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main([str(tmp_path / "x.gguf"), "--dtype", "q4_0", "--embd", "48"]) == 2
    assert "multiples of 32" in capsys.readouterr().err
