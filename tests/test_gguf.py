"""The header-only GGUF reader: values, tensor sizes, per-layer keys and every kind of bad file."""

from __future__ import annotations

import os
import random
import struct
import time
from collections.abc import Callable
from pathlib import Path

import gguf
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from gguf import PoolingType

import ollamatrio.gguf.cursor as gguf_cursor
from ollamatrio.errors import GGUFError
from ollamatrio.gguf import ArraySummary, GGUFInfo, is_gguf, read_gguf
from ollamatrio.testing import CHATML, write_tiny_gguf

TinyGGUF = Callable[..., Path]  # the tiny_gguf fixture's factory

MATRIX_TYPES = {"f32": QT.F32, "f16": QT.F16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0}
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7}


def matrix_bytes(rows: int, cols: int, qtype: QT) -> int:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    return rows * cols // block * size


def pad(n: int, alignment: int = 32) -> int:
    return -(-n // alignment) * alignment


def expected_tensor_bytes(
    *, layers: int, embd: int, heads: int, kv_heads: int, ff: int, vocab: int, qtype: QT
) -> int:
    """Independent arithmetic for the generator's llama layout (norms are F32)."""
    kv_width = kv_heads * (embd // heads)
    per_layer = (
        2 * embd * 4  # attn_norm, ffn_norm
        + 2 * matrix_bytes(embd, embd, qtype)  # attn_q, attn_output
        + 2 * matrix_bytes(kv_width, embd, qtype)  # attn_k, attn_v
        + 3 * matrix_bytes(ff, embd, qtype)  # ffn_gate, ffn_up, ffn_down
    )
    return layers * per_layer + 2 * matrix_bytes(vocab, embd, qtype) + embd * 4


# -- generated models ---------------------------------------------------------------------------


@pytest.mark.parametrize("tokenizer", ["llama", "gpt2"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0", "q4_0"])
def test_generated_model_values(tiny_gguf: TinyGGUF, dtype: str, tokenizer: str) -> None:
    path = tiny_gguf(dtype=dtype, tokenizer=tokenizer, layers=3, embd=64, heads=4, kv_heads=2)
    info = read_gguf(path)

    assert info.path == path
    assert info.version == 3
    assert info.file_size == path.stat().st_size
    assert info.alignment == 32
    assert info.data_offset % 32 == 0
    assert info.architecture == "llama"
    assert info.name == "tiny-llama"
    assert (info.block_count, info.embedding_length, info.context_length) == (3, 64, 2048)
    assert info.feed_forward_length == 128
    assert (info.head_count, info.head_count_kv) == (4, 2)
    assert (info.key_length, info.value_length) == (None, None)
    assert info.vocab_size == 300
    assert info.file_type == FILE_TYPES[dtype]
    assert (
        info.file_type_name == {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0"}[dtype]
    )
    assert info.chat_template == CHATML
    assert info.pooling_type is None
    assert info.sliding_window is None
    assert info.metadata["tokenizer.ggml.model"] == tokenizer

    assert len(info.tensors) == 1 + 9 * 3 + 2
    for t in info.tensors:
        assert t.type == (QT.F32 if len(t.shape) == 1 else MATRIX_TYPES[dtype]), t.name
    assert info.tensor("token_embd.weight").shape == (64, 300)  # ne order
    assert info.tensor("blk.2.attn_k.weight").shape == (64, 32)
    assert info.tensor("no.such.tensor") is None

    qtype = MATRIX_TYPES[dtype]
    assert info.tensor_bytes == expected_tensor_bytes(
        layers=3, embd=64, heads=4, kv_heads=2, ff=128, vocab=300, qtype=qtype
    )
    assert info.parameter_count == sum(t.n_elements for t in info.tensors)
    # Tensors are packed back to back with padding, up to the end of the file.
    assert info.data_offset + sum(pad(t.nbytes) for t in info.tensors) == info.file_size


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8_0", "q4_0"])
def test_matches_gguf_package_reader(tiny_gguf: TinyGGUF, dtype: str) -> None:
    path = tiny_gguf(dtype=dtype, kv_heads=2)
    info = read_gguf(path)
    reference = gguf.GGUFReader(path)

    ours = [
        (t.name, int(t.type), t.shape, info.data_offset + t.offset, t.nbytes) for t in info.tensors
    ]
    theirs = [
        (
            t.name,
            int(t.tensor_type),
            tuple(int(d) for d in t.shape),
            int(t.data_offset),
            int(t.n_bytes),
        )
        for t in reference.tensors
    ]
    assert ours == theirs
    fields = {k: f for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    assert list(info.metadata) == list(fields)
    for key, field in fields.items():
        value = info.metadata[key]
        if isinstance(value, ArraySummary):
            assert value.length == len(field.data), key
            assert value.item_type == field.types[-1], key
        else:
            assert value == field.contents(), key


def test_long_arrays_are_summarised_short_ones_decoded(tiny_gguf: TinyGGUF) -> None:
    small = read_gguf(tiny_gguf(vocab=300)).metadata
    assert small["tokenizer.ggml.tokens"] == ArraySummary(VT.STRING, 300)
    assert len(small["tokenizer.ggml.tokens"]) == 300
    # Numeric arrays up to 1024 items are decoded (per-layer hyperparameters must survive).
    assert isinstance(small["tokenizer.ggml.scores"], list)
    assert len(small["tokenizer.ggml.token_type"]) == 300

    big = read_gguf(tiny_gguf(vocab=2000, tokenizer="gpt2")).metadata
    assert big["tokenizer.ggml.token_type"] == ArraySummary(VT.INT32, 2000)
    assert big["tokenizer.ggml.merges"] == ["\u0120 t", "h e", "\u0120 a", "i n", "\u0120t he"]


@pytest.mark.parametrize("tokenizer", ["llama", "gpt2"])
def test_full_arrays_match_the_gguf_package_reader(tiny_gguf: TinyGGUF, tokenizer: str) -> None:
    """``full_array`` decodes summarised arrays (strings and numbers) from the file, as
    /api/show's verbose answer needs them."""
    path = tiny_gguf(vocab=2000, tokenizer=tokenizer)
    info = read_gguf(path)
    reference = gguf.GGUFReader(path)
    summarised = [k for k, v in info.metadata.items() if isinstance(v, ArraySummary)]
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.token_type"} <= set(summarised)
    for key in info.metadata:
        if key.startswith("tokenizer.") and isinstance(info.metadata[key], list | ArraySummary):
            assert info.full_array(key) == reference.fields[key].contents(), key


def test_per_layer_arrays_become_tuples(tiny_gguf: TinyGGUF) -> None:
    path = tiny_gguf(
        layers=4,
        extra_metadata={
            "llama.attention.head_count": [4, 4, 2, 2],
            "llama.attention.head_count_kv": [2, 1, 0, 1],
            "llama.feed_forward_length": [128, 64, 64, 128],
            "llama.attention.sliding_window": 512,
            "llama.attention.sliding_window_pattern": [True, False, True, False],
        },
    )
    info = read_gguf(path)
    assert info.head_count == (4, 4, 2, 2)
    assert info.head_count_kv == (2, 1, 0, 1)
    assert info.feed_forward_length == (128, 64, 64, 128)
    assert info.sliding_window == 512
    assert info.sliding_window_pattern == (1, 0, 1, 0)


@pytest.mark.parametrize(
    ("extra", "attribute", "expected"),
    [
        ({"llama.attention.head_count_kv": None}, "head_count_kv", 4),
        ({"llama.vocab_size": None}, "vocab_size", 300),
        ({"llama.attention.key_length": 96}, "key_length", 96),
        ({"llama.attention.value_length": 80}, "value_length", 80),
        ({"llama.attention.sliding_window_pattern": 6}, "sliding_window_pattern", 6),
        ({"llama.ssm.conv_kernel": 4}, "ssm_conv_kernel", 4),
        ({"llama.ssm.inner_size": 1536}, "ssm_inner_size", 1536),
        ({"llama.ssm.state_size": 16}, "ssm_state_size", 16),
        ({"llama.ssm.group_count": 8}, "ssm_group_count", 8),
        ({"llama.ssm.conv_kernel": None}, "ssm_conv_kernel", None),
        ({"tokenizer.chat_template": None}, "chat_template", None),
        ({"general.file_type": 15}, "file_type_name", "Q4_K_M"),
        ({"general.file_type": 999}, "file_type_name", None),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_optional_keys(tiny_gguf: TinyGGUF, extra: dict, attribute: str, expected: object) -> None:
    info = read_gguf(tiny_gguf(extra_metadata=extra))
    assert getattr(info, attribute) == expected


@pytest.mark.parametrize(
    ("pooling", "expected"),
    [
        (None, None),
        ("mean", PoolingType.MEAN),
        ("cls", PoolingType.CLS),
        ("last", PoolingType.LAST),
    ],
)
def test_pooling_type(tiny_gguf: TinyGGUF, pooling: str | None, expected: int | None) -> None:
    assert read_gguf(tiny_gguf(pooling=pooling)).pooling_type == expected


def test_layer_grouping(tiny_gguf: TinyGGUF) -> None:
    info = read_gguf(tiny_gguf(layers=12))
    layers = info.layer_tensors()
    assert list(layers) == list(range(12))
    for index, tensors in layers.items():
        assert len(tensors) == 9
        assert all(t.name.startswith(f"blk.{index}.") and t.layer == index for t in tensors)
    assert [t.name for t in info.non_layer_tensors()] == [
        "token_embd.weight",
        "output_norm.weight",
        "output.weight",
    ]
    assert all(t.layer is None for t in info.non_layer_tensors())


# 8B-class (Llama-3 shape, Q4_0) and TinyLlama-class (F16) models declared by sparse files.
SPARSE_SHAPES = {
    "llama3-8b-q4_0": dict(
        layers=32, embd=4096, heads=32, kv_heads=8, ff=14336, vocab=128256, dtype="q4_0"
    ),
    "tinyllama-f16": dict(
        layers=22, embd=2048, heads=32, kv_heads=4, ff=5632, vocab=32000, dtype="f16"
    ),
}


@pytest.mark.parametrize("shape", SPARSE_SHAPES.values(), ids=SPARSE_SHAPES.keys())
def test_sparse_declared_sizes_are_exact(tiny_gguf: TinyGGUF, shape: dict) -> None:
    path = tiny_gguf(sparse=True, tokenizer="gpt2", **shape)
    info = read_gguf(path)
    qtype = MATRIX_TYPES[shape["dtype"]]
    expected = expected_tensor_bytes(
        layers=shape["layers"],
        embd=shape["embd"],
        heads=shape["heads"],
        kv_heads=shape["kv_heads"],
        ff=shape["ff"],
        vocab=shape["vocab"],
        qtype=qtype,
    )
    assert info.tensor_bytes == expected
    assert info.data_offset + sum(pad(t.nbytes) for t in info.tensors) == info.file_size
    assert len(info.tensors) == 9 * shape["layers"] + 3
    assert info.vocab_size == shape["vocab"]
    assert info.head_count_kv == shape["kv_heads"]
    assert path.stat().st_blocks * 512 < 16 * 2**20  # the weights take no disk


def test_sparse_8b_parameter_count(tiny_gguf: TinyGGUF) -> None:
    info = read_gguf(tiny_gguf(sparse=True, tokenizer="gpt2", **SPARSE_SHAPES["llama3-8b-q4_0"]))
    # Llama-3-8B's published count with an untied output head: 8.03 B parameters.
    assert info.parameter_count == 8_030_261_248
    assert info.tensor_bytes == 4_517_937_152


# -- the real model -------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_header(smollm2_path: Path) -> None:
    info = read_gguf(smollm2_path)
    assert info.architecture == "llama"
    assert (info.block_count, info.embedding_length, info.feed_forward_length) == (30, 576, 1536)
    assert (info.head_count, info.head_count_kv) == (9, 3)
    assert info.context_length == 8192
    assert (info.key_length, info.value_length) == (None, None)
    assert info.vocab_size == 49152
    assert info.file_type == 3
    assert info.file_type_name == "Q4_1"
    assert "<|im_start|>" in (info.chat_template or "")
    assert info.metadata["tokenizer.ggml.tokens"] == ArraySummary(VT.STRING, 49152)
    assert info.metadata["tokenizer.ggml.merges"] == ArraySummary(VT.STRING, 48900)
    assert len(info.tensors) == 272
    assert info.tensor_bytes == 96_576_768
    assert info.tensor("output.weight") is None  # tied embeddings
    assert info.tensor("token_embd.weight").type == QT.Q8_0
    layers = info.layer_tensors()
    assert len(layers) == 30
    assert {sum(t.nbytes for t in ts) for ts in layers.values()} == {2_216_448}


# -- bad files ------------------------------------------------------------------------------------


def s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, VT.UINT32, struct.pack("<I", value))


def tensor(name: str, dims: tuple[int, ...], ttype: int, offset: int) -> bytes:
    return (
        s(name)
        + struct.pack("<I", len(dims))
        + struct.pack(f"<{len(dims)}Q", *dims)
        + struct.pack("<IQ", ttype, offset)
    )


def gguf_bytes(
    kvs: tuple[bytes, ...] = (),
    tensors: tuple[bytes, ...] = (),
    *,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    version: int = 3,
    data: bytes = b"",
) -> bytes:
    """A hand-built GGUF: header, kvs, tensor infos, then (if any) padding to 32 and ``data``.

    Nothing follows the last byte written, so a claimed length or count that goes further
    really does run past the end of the file.
    """
    n_kv = len(kvs) if n_kv is None else n_kv
    n_tensors = len(tensors) if n_tensors is None else n_tensors
    head = (
        b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + b"".join(kvs) + b"".join(tensors)
    )
    if not tensors and not data:
        return head
    return head + b"\0" * (pad(len(head)) - len(head)) + data


ARCH = kv("general.architecture", VT.STRING, s("llama"))
F32_ROW = tensor("t", (8,), QT.F32, 0)

BAD_FILES: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "not a GGUF file"),
    "text": (b"this is a text file renamed to .gguf\n", "not a GGUF file"),
    "ggml-magic": (b"lmgg" + bytes(100), "not a GGUF file"),
    "version-1": (gguf_bytes(version=1), "unsupported GGUF version 1"),
    "version-4": (gguf_bytes(version=4), "unsupported GGUF version 4"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
    "header-cut": (b"GGUF\x03\x00\x00\x00\x01", "truncated"),
    "absurd-tensor-count": (gguf_bytes(n_tensors=1 << 60), "implausible header"),
    "absurd-kv-count": (gguf_bytes(n_kv=1 << 60), "implausible header"),
    "counts-exceed-file": (gguf_bytes((ARCH,), n_kv=50), "cannot fit"),
    "key-length-absurd": (
        gguf_bytes(n_kv=1) + struct.pack("<Q", 1 << 62) + b"key-bytes",
        "-byte string",
    ),
    "value-string-too-long": (
        gguf_bytes((s("k") + struct.pack("<IQ", VT.STRING, 10_000) + b"abc",)),
        "10000-byte string",
    ),
    "unknown-value-type": (gguf_bytes((kv("k", 99, b"\0" * 8),)), "unknown value type 99"),
    "kv-value-cut": (
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + s("general.alignment")
        + struct.pack("<I", VT.UINT32),
        "truncated",
    ),
    "duplicate-key": (gguf_bytes((ARCH, ARCH)), "duplicate metadata key 'general.architecture'"),
    "string-array-absurd": (
        gguf_bytes((kv("a", VT.ARRAY, struct.pack("<IQ", VT.STRING, 1 << 40)),)),
        "claims 1099511627776 strings",
    ),
    "number-array-absurd": (
        gguf_bytes((kv("a", VT.ARRAY, struct.pack("<IQ", VT.UINT64, 1 << 40)),)),
        "claims 1099511627776 items",
    ),
    "nested-array": (
        gguf_bytes((kv("a", VT.ARRAY, struct.pack("<IQ", VT.ARRAY, 1)),)),
        "nests arrays",
    ),
    "array-unknown-item-type": (
        gguf_bytes((kv("a", VT.ARRAY, struct.pack("<IQ", 77, 1)),)),
        "unknown value type 77",
    ),
    "skipped-string-runs-past-end": (
        gguf_bytes(
            (
                kv(
                    "tokenizer.ggml.tokens",
                    VT.ARRAY,
                    struct.pack("<IQ", VT.STRING, 100) + s("x") * 99 + struct.pack("<Q", 1 << 40),
                ),
            )
        ),
        "truncated",
    ),
    "skipped-string-length-overflows": (
        gguf_bytes(
            (
                kv(
                    "tokenizer.ggml.tokens",
                    VT.ARRAY,
                    struct.pack("<IQ", VT.STRING, 100)
                    + s("x") * 50
                    + struct.pack("<Q", (1 << 64) - 1)
                    + s("x") * 49,
                ),
            )
        ),
        "truncated",
    ),
    "block-count-is-a-string": (
        gguf_bytes((ARCH, kv("llama.block_count", VT.STRING, s("thirty")))),
        "should be an integer",
    ),
    "head-count-array-of-strings": (
        gguf_bytes(
            (
                ARCH,
                kv(
                    "llama.attention.head_count",
                    VT.ARRAY,
                    struct.pack("<IQ", VT.STRING, 1) + s("x"),
                ),
            )
        ),
        "per-layer integer array",
    ),
    "alignment-not-power-of-two": (gguf_bytes((kv_u32("general.alignment", 24),)), "power of two"),
    "alignment-zero": (gguf_bytes((kv_u32("general.alignment", 0),)), "power of two"),
    "too-many-dims": (
        gguf_bytes(tensors=(tensor("t", (1, 1, 1, 1, 1), QT.F32, 0),)),
        "5 dimensions",
    ),
    "unknown-tensor-type": (
        gguf_bytes(tensors=(tensor("t", (32,), 4, 0),)),
        "unknown tensor type 4",
    ),
    "row-not-block-multiple": (
        gguf_bytes(tensors=(tensor("t", (33,), QT.Q4_0, 0),)),
        "not a multiple of its block size 32",
    ),
    "absurd-shape": (
        gguf_bytes(tensors=(tensor("t", (1 << 40, 1 << 40), QT.F32, 0),)),
        "implausible shape",
    ),
    "tensor-info-cut": (gguf_bytes(tensors=(F32_ROW,))[:50], "truncated"),
    "tensor-data-missing": (gguf_bytes(tensors=(F32_ROW,)), "beyond the end"),
    "tensor-data-short": (gguf_bytes(tensors=(F32_ROW,), data=bytes(31)), "beyond the end"),
    "tensor-offset-misaligned": (
        gguf_bytes(tensors=(tensor("t", (8,), QT.F32, 4),), data=bytes(64)),
        "not a multiple of the alignment",
    ),
    "duplicate-tensor": (
        gguf_bytes(tensors=(F32_ROW, tensor("t", (8,), QT.F32, 32)), data=bytes(64)),
        "duplicate tensor name 't'",
    ),
}


@pytest.mark.parametrize(("content", "message"), BAD_FILES.values(), ids=BAD_FILES.keys())
def test_bad_file_fails_fast(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    start = time.perf_counter()
    with pytest.raises(GGUFError) as excinfo:
        read_gguf(path)
    assert time.perf_counter() - start < 0.5
    assert message in str(excinfo.value)
    assert str(excinfo.value).startswith(f"{path}: ")


def test_good_hand_built_file_reads(tmp_path: Path) -> None:
    """The builder above makes valid files: the bad cases fail for their stated reason only."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(gguf_bytes((ARCH, kv_u32("llama.block_count", 1)), (F32_ROW,), data=bytes(32)))
    info = read_gguf(path)
    assert info.architecture == "llama"
    assert info.block_count == 1
    assert info.tensors[0].nbytes == 32
    assert info.data_offset == info.file_size - 32


def test_missing_architecture(tmp_path: Path) -> None:
    path = tmp_path / "no-arch.gguf"
    path.write_bytes(gguf_bytes((kv_u32("llama.block_count", 1),)))
    info = read_gguf(path)
    assert info.architecture == "unknown"
    assert info.block_count == 0
    assert info.vocab_size == 0
    assert info.tensors == ()


def test_string_over_limit_in_big_sparse_file(tmp_path: Path) -> None:
    """A 65 MiB string is refused even when the file is big enough to hold it."""
    path = tmp_path / "huge-string.gguf"
    path.write_bytes(gguf_bytes((s("k") + struct.pack("<IQ", VT.STRING, 65 * 2**20),)))
    os.truncate(path, 100 * 2**20)
    with pytest.raises(GGUFError, match="limit 67108864"):
        read_gguf(path)


def test_mutated_headers_raise_only_gguf_error(tiny_gguf: TinyGGUF, tmp_path: Path) -> None:
    """Random byte edits, overwritten lengths, deletions and cuts anywhere in the header."""
    source = tiny_gguf(tokenizer="gpt2", layers=1, dtype="q4_0")
    base = source.read_bytes()
    header_end = read_gguf(source).data_offset
    rng = random.Random(20261122)
    path = tmp_path / "mutant.gguf"
    outcomes = {"read": 0, "rejected": 0}
    for _ in range(400):
        data = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(header_end)
            match rng.randrange(3):
                case 0:
                    data[at] = rng.randrange(256)
                case 1:
                    data[at : at + 8] = rng.randrange(1 << 64).to_bytes(8, "little")
                case _:
                    del data[at : at + rng.randint(1, 40)]
        if rng.random() < 0.2:
            del data[rng.randrange(len(data)) :]
        path.write_bytes(data)
        try:
            read_gguf(path, cache=False)
            outcomes["read"] += 1
        except GGUFError:
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > 200  # most edits break something that is checked


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        ("bad_magic", "not a GGUF file"),
        ("truncated", "beyond the end"),
        ("absurd_counts", "implausible"),
    ],
)
def test_generated_corrupt_models(tiny_gguf: TinyGGUF, corrupt: str, message: str) -> None:
    with pytest.raises(GGUFError, match=message):
        read_gguf(tiny_gguf(corrupt=corrupt))


def test_sparse_truncated_model(tiny_gguf: TinyGGUF) -> None:
    path = tiny_gguf(sparse=True, corrupt="truncated", **SPARSE_SHAPES["tinyllama-f16"])
    with pytest.raises(GGUFError, match="beyond the end"):
        read_gguf(path)


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_unopenable_paths(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "model.gguf"
    if kind == "directory":
        path.mkdir()
    with pytest.raises(GGUFError, match="cannot open") as excinfo:
        read_gguf(path)
    assert isinstance(excinfo.value.__cause__, OSError)


def test_is_gguf(tiny_gguf: TinyGGUF, tmp_path: Path) -> None:
    assert is_gguf(tiny_gguf())
    assert not is_gguf(tiny_gguf(corrupt="bad_magic"))
    assert not is_gguf(tmp_path / "missing.gguf")
    assert not is_gguf(tmp_path)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert not is_gguf(empty)


def test_cache_returns_the_parsed_header_until_the_file_changes(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", layers=2)
    first = read_gguf(path)
    assert read_gguf(path) is first
    assert read_gguf(str(path)) is first
    uncached = read_gguf(path, cache=False)
    assert uncached is not first
    assert uncached.tensors == first.tensors

    replacement = write_tiny_gguf(tmp_path / "other.gguf", layers=3)
    os.replace(replacement, path)  # a new file at the same path
    assert read_gguf(path).block_count == 3

    write_tiny_gguf(path, layers=4)  # rewritten in place
    assert read_gguf(path).block_count == 4


def test_failures_are_not_cached(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"not yet")
    with pytest.raises(GGUFError):
        read_gguf(path)
    write_tiny_gguf(path)
    assert read_gguf(path).block_count == 2


def test_info_is_read_only(tiny_gguf: TinyGGUF) -> None:
    info: GGUFInfo = read_gguf(tiny_gguf())
    with pytest.raises(TypeError):
        info.metadata["general.name"] = "x"  # type: ignore[index]
    with pytest.raises(AttributeError):
        info.version = 2  # type: ignore[misc]


# -- a vocabulary llama.cpp cannot load ---------------------------------------------------


@pytest.mark.parametrize("tokenizer", ["llama", "gpt2"])
def test_duplicate_token_is_found(tiny_gguf: TinyGGUF, tokenizer: str) -> None:
    assert read_gguf(tiny_gguf(tokenizer=tokenizer)).duplicate_token is None
    found = read_gguf(tiny_gguf(corrupt="duplicate_tokens", tokenizer=tokenizer)).duplicate_token
    assert found is not None
    assert (found.first, found.second) == (298, 299)
    assert str(found).startswith(f"duplicate token {found.text!r} in the vocabulary (ids 298")


def test_duplicate_token_across_read_buffers(
    tiny_gguf: TinyGGUF, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gguf_cursor, "_CHUNK", 16)  # nearly every item crosses a refill
    for corrupt, expected in ((None, None), ("duplicate_tokens", (998, 999))):
        info = read_gguf(tiny_gguf(vocab=1000, corrupt=corrupt), cache=False)
        found = info.duplicate_token
        assert (found.first, found.second) == expected if expected else found is None


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (["a", "b", "a"], (0, 2)),  # a short list, decoded with the header
        (["", "x", ""], None),  # llama.cpp names empty tokens [EMPTY_<id>]
        (["", "[EMPTY_0]"], (0, 1)),  # ... which can collide with a real one
        (["\ufffd", "\ufffd"], (0, 1)),
    ],
)
def test_duplicate_token_compares_as_llama_cpp(
    tmp_path: Path, tokens: list[str], expected: tuple[int, int] | None
) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf", extra_metadata={"tokenizer.ggml.tokens": tokens})
    found = read_gguf(path).duplicate_token
    assert (found.first, found.second) == expected if expected else found is None


def test_no_vocab_has_no_duplicates(tmp_path: Path) -> None:
    path = write_tiny_gguf(
        tmp_path / "m.gguf",
        extra_metadata={"tokenizer.ggml.model": "no_vocab", "tokenizer.ggml.tokens": ["a", "a"]},
    )
    assert read_gguf(path).duplicate_token is None


def test_smollm2_has_no_duplicate_token(smollm2_path: Path) -> None:
    assert read_gguf(smollm2_path).duplicate_token is None
