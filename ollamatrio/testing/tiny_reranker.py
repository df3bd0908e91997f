"""Generate a small random-weight reranker GGUF that llama.cpp loads and scores with.

A BERT cross-encoder as ``convert_hf_to_gguf.py`` writes one for a
``BertForSequenceClassification`` model: ``bert.pooling_type`` is rank (4), the pooler is
``cls.weight``/``cls.bias`` and the one-label classifier ``cls.output.weight``/``.bias``.
Its WordPiece vocabulary holds the special tokens, the letters and a few words, so any
lower-case English text tokenises.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import numpy as np
from gguf import GGUFValueType, GGUFWriter, Keys, LlamaFileType, PoolingType, TokenType

ARCH: Final = "bert"
_WORD_START: Final = "\u2581"
_SPECIALS: Final = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_WORDS: Final = (
    "the", "is", "of", "and", "to", "in", "what", "capital", "france", "paris", "berlin",
    "germany", "cat", "dog", "sat", "on", "mat", "city", "river", "weather", "today", "sunny",
)  # fmt: skip


def _vocabulary() -> list[str]:
    """llama.cpp's WordPiece form, as the converter writes it: a word-start piece carries
    the SentencePiece marker, a continuation piece (BERT's ``##x``) is bare."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    characters = letters + [str(d) for d in range(10)] + list(".,?!'\"-:;()")
    return [
        *_SPECIALS,
        *(_WORD_START + c for c in characters),
        *letters,
        *(_WORD_START + w for w in _WORDS),
    ]


def write_tiny_reranker(
    path: str | os.PathLike[str],
    *,
    layers: int = 2,
    embd: int = 64,
    heads: int = 4,
    ff: int = 128,
    ctx: int = 512,
    seed: int = 0,
    name: str = "tiny-reranker",
) -> Path:
    """Write a BERT reranker GGUF (F32 weights) and return its path."""
    out = Path(path)
    tokens = _vocabulary()
    rng = np.random.default_rng(seed)

    def arch(key: str) -> str:
        return key.format(arch=ARCH)

    writer = GGUFWriter(out, ARCH)
    try:
        writer.add_name(name)
        writer.add_file_type(int(LlamaFileType.ALL_F32))
        writer.add_uint32(arch(Keys.LLM.CONTEXT_LENGTH), ctx)
        writer.add_uint32(arch(Keys.LLM.EMBEDDING_LENGTH), embd)
        writer.add_uint32(arch(Keys.LLM.BLOCK_COUNT), layers)
        writer.add_uint32(arch(Keys.LLM.FEED_FORWARD_LENGTH), ff)
        writer.add_uint32(arch(Keys.Attention.HEAD_COUNT), heads)
        writer.add_float32(arch(Keys.Attention.LAYERNORM_EPS), 1e-12)
        writer.add_bool(arch(Keys.Attention.CAUSAL), False)
        writer.add_uint32(arch(Keys.LLM.POOLING_TYPE), int(PoolingType.RANK))
        writer.add_string(Keys.Tokenizer.MODEL, "bert")
        writer.add_array(Keys.Tokenizer.LIST, tokens)
        writer.add_array(
            Keys.Tokenizer.TOKEN_TYPE,
            [int(TokenType.CONTROL)] * len(_SPECIALS)
            + [int(TokenType.NORMAL)] * (len(tokens) - len(_SPECIALS)),
        )
        writer.add_uint32(Keys.Tokenizer.TOKEN_TYPE_COUNT, 2)
        for key, token in (
            (Keys.Tokenizer.PAD_ID, "[PAD]"),
            (Keys.Tokenizer.UNK_ID, "[UNK]"),
            (Keys.Tokenizer.BOS_ID, "[CLS]"),
            (Keys.Tokenizer.SEP_ID, "[SEP]"),
            (Keys.Tokenizer.MASK_ID, "[MASK]"),
        ):
            writer.add_uint32(key, tokens.index(token))
        writer.add_key_value(Keys.Tokenizer.ADD_BOS, True, GGUFValueType.BOOL)
        writer.add_key_value(Keys.Tokenizer.ADD_SEP, True, GGUFValueType.BOOL)

        def matrix(rows: int, cols: int) -> np.ndarray:
            return (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)

        def zeros(n: int) -> np.ndarray:
            return np.zeros(n, np.float32)

        def ones(n: int) -> np.ndarray:
            return np.ones(n, np.float32)

        writer.add_tensor("token_embd.weight", matrix(len(tokens), embd))
        writer.add_tensor("token_types.weight", matrix(2, embd))
        writer.add_tensor("position_embd.weight", matrix(ctx, embd))
        writer.add_tensor("token_embd_norm.weight", ones(embd))
        writer.add_tensor("token_embd_norm.bias", zeros(embd))
        for i in range(layers):
            blk = f"blk.{i}"
            for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
                writer.add_tensor(f"{blk}.{part}.weight", matrix(embd, embd))
                writer.add_tensor(f"{blk}.{part}.bias", zeros(embd))
            writer.add_tensor(f"{blk}.attn_output_norm.weight", ones(embd))
            writer.add_tensor(f"{blk}.attn_output_norm.bias", zeros(embd))
            writer.add_tensor(f"{blk}.ffn_up.weight", matrix(ff, embd))
            writer.add_tensor(f"{blk}.ffn_up.bias", zeros(ff))
            writer.add_tensor(f"{blk}.ffn_down.weight", matrix(embd, ff))
            writer.add_tensor(f"{blk}.ffn_down.bias", zeros(embd))
            writer.add_tensor(f"{blk}.layer_output_norm.weight", ones(embd))
            writer.add_tensor(f"{blk}.layer_output_norm.bias", zeros(embd))
        writer.add_tensor("cls.weight", matrix(embd, embd))
        writer.add_tensor("cls.bias", zeros(embd))
        writer.add_tensor("cls.output.weight", matrix(1, embd))
        writer.add_tensor("cls.output.bias", zeros(1))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return out
