"""Generate small random-weight llama GGUF files that llama.cpp loads and runs.

Sparse mode declares any size without using disk: the tensor data is a hole made by
``truncate()`` (all-zero weights, which still load and generate).  Corrupt variants exercise
the error paths of the header reader and of runners.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGMLQuantizationType,
    GGUFValueType,
    GGUFWriter,
    Keys,
    LlamaFileType,
    PoolingType,
)
from gguf.quants import quantize

from ollamatrio.testing.vocab import TokenizerKind, Vocabulary, build_vocabulary

Dtype = Literal["f32", "f16", "q8_0", "q4_0"]
Pooling = Literal["mean", "cls", "last"]
Corruption = Literal["bad_magic", "truncated", "absurd_counts", "duplicate_tokens"]
#: Plain Python metadata values; ``None`` removes a key the generator would write.
MetadataValue = bool | int | float | str | Sequence[bool | int | float | str] | None

CORRUPTIONS: Final[tuple[Corruption, ...]] = (
    "bad_magic",
    "truncated",
    "absurd_counts",
    "duplicate_tokens",
)
ARCH: Final = "llama"

CHATML: Final = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_QTYPES: Final[Mapping[Dtype, GGMLQuantizationType]] = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0,
}
_FILE_TYPES: Final[Mapping[Dtype, LlamaFileType]] = {
    "f32": LlamaFileType.ALL_F32,
    "f16": LlamaFileType.MOSTLY_F16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0,
    "q4_0": LlamaFileType.MOSTLY_Q4_0,
}
_POOLING: Final[Mapping[Pooling, PoolingType]] = {
    "mean": PoolingType.MEAN,
    "cls": PoolingType.CLS,
    "last": PoolingType.LAST,
}
_BAD_MAGIC: Final = b"NOPE"
_ABSURD_COUNT: Final = 1 << 60


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order: the GGUF ne reversed
    type: GGMLQuantizationType

    @property
    def nbytes(self) -> int:
        block_size, type_size = GGML_QUANT_SIZES[self.type]
        return int(np.prod(self.shape)) // block_size * type_size


def write_tiny_gguf(
    path: str | os.PathLike[str],
    *,
    layers: int = 2,
    embd: int = 64,
    heads: int = 4,
    kv_heads: int | None = None,
    ff: int | None = None,
    vocab: int = 300,
    ctx: int = 2048,
    dtype: Dtype = "f32",
    tokenizer: TokenizerKind = "llama",
    sparse: bool = False,
    seed: int = 0,
    name: str = "tiny-llama",
    chat_template: str | None = CHATML,
    pooling: Pooling | None = None,
    corrupt: Corruption | None = None,
    extra_metadata: Mapping[str, MetadataValue] | None = None,
) -> Path:
    """Write a llama-architecture GGUF and return its path.

    Matrices use ``dtype``; norm vectors stay F32.  ``ff`` defaults to ``2 * embd`` and
    ``kv_heads`` to ``heads``.  ``sparse`` leaves the tensor data as a hole (zeros, no disk).
    ``pooling`` writes ``llama.pooling_type`` (an embedding model).  ``corrupt``:

    - ``bad_magic``: the first four bytes are not ``GGUF``;
    - ``truncated``: the file is cut in the middle of the tensor data;
    - ``absurd_counts``: the header claims 2**60 tensors and 2**60 metadata keys;
    - ``duplicate_tokens``: the last token string repeats the one before it, a file that
      passes structural checks but makes llama.cpp abort() while loading the vocabulary.

    ``extra_metadata`` adds or overrides keys (``None`` deletes one).
    """
    out = Path(path)
    kv_heads = heads if kv_heads is None else kv_heads
    ff = 2 * embd if ff is None else ff
    _check_shape(layers=layers, embd=embd, heads=heads, kv_heads=kv_heads, ff=ff, dtype=dtype)
    if extra_metadata and Keys.General.ARCHITECTURE in extra_metadata:
        raise ValueError(f"{Keys.General.ARCHITECTURE} is always {ARCH!r} here")
    if pooling is not None and pooling not in _POOLING:
        raise ValueError(f"unknown pooling {pooling!r}; choose from {tuple(_POOLING)}")
    if corrupt is not None and corrupt not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corrupt!r}; choose from {CORRUPTIONS}")

    words = build_vocabulary(tokenizer, vocab)
    if corrupt == "duplicate_tokens":
        words = words.with_duplicate_token()
    metadata = _metadata(
        name=name,
        layers=layers,
        embd=embd,
        heads=heads,
        kv_heads=kv_heads,
        ff=ff,
        ctx=ctx,
        dtype=dtype,
        words=words,
        chat_template=chat_template,
        pooling=pooling,
    )
    for key, value in (extra_metadata or {}).items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = _entry(value)
    tensors = list(_tensors(layers, embd, heads, kv_heads, ff, len(words.tokens), dtype))

    data_offset, data_size = _write(out, metadata, tensors, sparse=sparse, seed=seed)

    if corrupt == "bad_magic":
        _overwrite(out, 0, _BAD_MAGIC)
    elif corrupt == "absurd_counts":
        _overwrite(out, 8, struct.pack("<QQ", _ABSURD_COUNT, _ABSURD_COUNT))
    elif corrupt == "truncated":
        os.truncate(out, data_offset + data_size // 2)
    return out


def _check_shape(
    *, layers: int, embd: int, heads: int, kv_heads: int, ff: int, dtype: Dtype
) -> None:
    if dtype not in _QTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {tuple(_QTYPES)}")
    if min(layers, embd, heads, kv_heads, ff) < 1:
        raise ValueError("layers, embd, heads, kv_heads and ff must be positive")
    if embd % heads or heads % kv_heads:
        raise ValueError("embd must be a multiple of heads, and heads a multiple of kv_heads")
    block_size = GGML_QUANT_SIZES[_QTYPES[dtype]][0]
    if embd % block_size or ff % block_size:
        raise ValueError(f"{dtype} needs embd and ff to be multiples of {block_size}")


def _value_type(value: object) -> GGUFValueType:
    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        if value < 0:
            return GGUFValueType.INT32 if value >= -(1 << 31) else GGUFValueType.INT64
        return GGUFValueType.UINT32 if value < (1 << 32) else GGUFValueType.UINT64
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    if isinstance(value, Sequence) and value:
        return GGUFValueType.ARRAY
    raise ValueError(f"cannot store {value!r} as GGUF metadata")


@dataclass(frozen=True)
class _Entry:
    value: Any
    type: GGUFValueType
    item_type: GGUFValueType | None = None  # arrays only


_Metadata = dict[str, _Entry]


def _entry(value: MetadataValue) -> _Entry:
    vtype = _value_type(value)
    if vtype == GGUFValueType.ARRAY:
        assert isinstance(value, Sequence)
        return _Entry(list(value), vtype, _value_type(value[0]))
    return _Entry(value, vtype)


def _metadata(
    *,
    name: str,
    layers: int,
    embd: int,
    heads: int,
    kv_heads: int,
    ff: int,
    ctx: int,
    dtype: Dtype,
    words: Vocabulary,
    chat_template: str | None,
    pooling: Pooling | None,
) -> _Metadata:
    u32, f32, string, array = (
        GGUFValueType.UINT32,
        GGUFValueType.FLOAT32,
        GGUFValueType.STRING,
        GGUFValueType.ARRAY,
    )

    def arch(template: str) -> str:
        return template.format(arch=ARCH)

    md: _Metadata = {
        Keys.General.NAME: _Entry(name, string),
        Keys.General.FILE_TYPE: _Entry(int(_FILE_TYPES[dtype]), u32),
        Keys.General.QUANTIZATION_VERSION: _Entry(2, u32),
        arch(Keys.LLM.CONTEXT_LENGTH): _Entry(ctx, u32),
        arch(Keys.LLM.EMBEDDING_LENGTH): _Entry(embd, u32),
        arch(Keys.LLM.BLOCK_COUNT): _Entry(layers, u32),
        arch(Keys.LLM.FEED_FORWARD_LENGTH): _Entry(ff, u32),
        arch(Keys.Attention.HEAD_COUNT): _Entry(heads, u32),
        arch(Keys.Attention.HEAD_COUNT_KV): _Entry(kv_heads, u32),
        arch(Keys.Rope.DIMENSION_COUNT): _Entry(embd // heads, u32),
        arch(Keys.Attention.LAYERNORM_RMS_EPS): _Entry(1e-5, f32),
        arch(Keys.Rope.FREQ_BASE): _Entry(10000.0, f32),
        arch(Keys.LLM.VOCAB_SIZE): _Entry(len(words.tokens), u32),
    }
    if pooling is not None:
        md[arch(Keys.LLM.POOLING_TYPE)] = _Entry(int(_POOLING[pooling]), u32)
    md[Keys.Tokenizer.MODEL] = _Entry(words.model, string)
    if words.pre is not None:
        md[Keys.Tokenizer.PRE] = _Entry(words.pre, string)
    md[Keys.Tokenizer.LIST] = _Entry(words.tokens, array, string)
    if words.scores is not None:
        md[Keys.Tokenizer.SCORES] = _Entry(words.scores, array, f32)
    md[Keys.Tokenizer.TOKEN_TYPE] = _Entry(words.token_types, array, GGUFValueType.INT32)
    if words.merges is not None:
        md[Keys.Tokenizer.MERGES] = _Entry(words.merges, array, string)
    md[Keys.Tokenizer.BOS_ID] = _Entry(words.bos, u32)
    md[Keys.Tokenizer.EOS_ID] = _Entry(words.eos, u32)
    if words.unk is not None:
        md[Keys.Tokenizer.UNK_ID] = _Entry(words.unk, u32)
    md[Keys.Tokenizer.ADD_BOS] = _Entry(words.model == "llama", GGUFValueType.BOOL)
    if chat_template is not None:
        md[Keys.Tokenizer.CHAT_TEMPLATE] = _Entry(chat_template, string)
    return md


def _tensors(
    layers: int, embd: int, heads: int, kv_heads: int, ff: int, n_vocab: int, dtype: Dtype
) -> Iterator[_Tensor]:
    matrix, vector = _QTYPES[dtype], GGMLQuantizationType.F32
    head_dim = embd // heads
    yield _Tensor("token_embd.weight", (n_vocab, embd), matrix)
    for i in range(layers):
        blk = f"blk.{i}"
        yield _Tensor(f"{blk}.attn_norm.weight", (embd,), vector)
        yield _Tensor(f"{blk}.attn_q.weight", (heads * head_dim, embd), matrix)
        yield _Tensor(f"{blk}.attn_k.weight", (kv_heads * head_dim, embd), matrix)
        yield _Tensor(f"{blk}.attn_v.weight", (kv_heads * head_dim, embd), matrix)
        yield _Tensor(f"{blk}.attn_output.weight", (embd, heads * head_dim), matrix)
        yield _Tensor(f"{blk}.ffn_norm.weight", (embd,), vector)
        yield _Tensor(f"{blk}.ffn_gate.weight", (ff, embd), matrix)
        yield _Tensor(f"{blk}.ffn_up.weight", (ff, embd), matrix)
        yield _Tensor(f"{blk}.ffn_down.weight", (embd, ff), matrix)
    yield _Tensor("output_norm.weight", (embd,), vector)
    yield _Tensor("output.weight", (n_vocab, embd), matrix)


def _pad(n: int) -> int:
    return GGUFWriter.ggml_pad(n, GGUF_DEFAULT_ALIGNMENT)


def _write(
    out: Path, metadata: _Metadata, tensors: list[_Tensor], *, sparse: bool, seed: int
) -> tuple[int, int]:
    """Write the file; returns (data section offset, data section size)."""
    writer = GGUFWriter(out, ARCH)
    try:
        for key, entry in metadata.items():
            writer.add_key_value(key, entry.value, entry.type, sub_type=entry.item_type)
        for t in tensors:
            # A float32 dtype with raw_dtype set keeps ``shape`` as the logical shape.
            writer.add_tensor_info(
                t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.type
            )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        writer.flush()
        data_offset = _pad(out.stat().st_size)
        data_size = sum(_pad(t.nbytes) for t in tensors)
        if not sparse:
            rng = np.random.default_rng(seed)
            for t in tensors:
                writer.write_tensor_data(_weights(t, rng))
    finally:
        writer.close()
    if sparse:  # a hole of zeros: no disk blocks, any declared size
        os.truncate(out, data_offset + data_size)
    return data_offset, data_size


def _weights(t: _Tensor, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    if t.type == GGMLQuantizationType.F32 and len(t.shape) == 1:
        return np.ones(t.shape, np.float32)  # norm weights
    x = (rng.standard_normal(t.shape) * 0.02).astype(np.float32)
    if t.type == GGMLQuantizationType.F32:
        return x
    if t.type == GGMLQuantizationType.F16:
        return x.astype(np.float16)
    return quantize(x, t.type)


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
