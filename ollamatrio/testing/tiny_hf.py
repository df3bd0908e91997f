"""Generate small random-weight Hugging Face model folders (``config.json``, a tokenizer,
``*.safetensors`` shards) that the safetensors import converts.

The tokenizer is byte-level BPE: the generated GGUFs' small vocabulary
(:func:`tokenizer_from_vocabulary`) or a real model's, read back from its GGUF
(:func:`tokenizer_from_gguf`).  Shards are written here (an 8-byte header length, the JSON
header, the data): numpy has no bfloat16, so BF16 tensors are float32s with their lower 16
bits dropped.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
from gguf import GGUFReader, TokenType

from ollamatrio.testing.tiny_gguf import CHATML
from ollamatrio.testing.vocab import build_vocabulary

HFDtype = Literal["f32", "f16", "bf16"]
_STORED: Final = {"f32": "F32", "f16": "F16", "bf16": "BF16"}


@dataclass(frozen=True)
class HFTokenizer:
    """What ``tokenizer.json`` and ``tokenizer_config.json`` say, as lists."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos: int
    eos: int
    chat_template: str | None
    pre: Literal["gpt2", "smollm"] = "gpt2"

    def tokenizer_json(self) -> dict[str, Any]:
        added = [
            {"id": i, "content": t, "special": True}
            for i, (t, kind) in enumerate(zip(self.tokens, self.token_types, strict=True))
            if kind == TokenType.CONTROL
        ]
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
        steps = [byte_level]
        if self.pre == "smollm":
            steps = [{"type": "Digits", "individual_digits": True}, byte_level]
        return {
            "version": "1.0",
            "added_tokens": added,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": steps},
            "model": {
                "type": "BPE",
                "vocab": {t: i for i, t in enumerate(self.tokens)},
                "merges": self.merges,
            },
        }

    def tokenizer_config_json(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "bos_token": self.tokens[self.bos],
            "eos_token": self.tokens[self.eos],
            "add_bos_token": False,
        }
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        return config


def tokenizer_from_vocabulary(size: int = 300, chat_template: str | None = CHATML) -> HFTokenizer:
    """The generated GGUFs' byte-level BPE vocabulary (``tokenizer="gpt2"``)."""
    v = build_vocabulary("gpt2", size)
    assert v.merges is not None
    return HFTokenizer(v.tokens, v.token_types, v.merges, v.bos, v.eos, chat_template)


def tokenizer_from_gguf(path: str | os.PathLike[str]) -> HFTokenizer:
    """A real model's byte-level BPE tokenizer, read back from its GGUF."""
    fields = GGUFReader(path).fields

    def value(key: str) -> Any:
        return fields[key].contents()

    pre = value("tokenizer.ggml.pre")
    return HFTokenizer(
        tokens=value("tokenizer.ggml.tokens"),
        token_types=value("tokenizer.ggml.token_type"),
        merges=value("tokenizer.ggml.merges"),
        bos=value("tokenizer.ggml.bos_token_id"),
        eos=value("tokenizer.ggml.eos_token_id"),
        chat_template=value("tokenizer.chat_template"),
        pre="smollm" if pre == "smollm" else "gpt2",
    )


def write_safetensors(path: Path, tensors: dict[str, tuple[np.ndarray[Any, Any], str]]) -> None:
    """One shard: ``{name: (float32 array, "F32" | "F16" | "BF16")}``."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, (array, dtype) in tensors.items():
        data = _stored(array.astype(np.float32), dtype)
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


def _stored(array: np.ndarray[Any, Any], dtype: str) -> bytes:
    if dtype == "F32":
        return array.tobytes()
    if dtype == "F16":
        return array.astype(np.float16).tobytes()
    return (array.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def write_tiny_hf(
    folder: str | os.PathLike[str],
    tokenizer: HFTokenizer,
    *,
    architecture: str = "LlamaForCausalLM",
    layers: int = 2,
    embd: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    ff: int = 128,
    dtype: HFDtype = "f32",
    shards: int = 2,
    tie_embeddings: bool = False,
    seed: int = 0,
    config_extra: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """Write the folder; returns its files by name (as a create request names them).
    ``config_extra`` adds or replaces keys of ``config.json``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    vocab, head_dim = len(tokenizer.tokens), embd // heads
    qwen2 = architecture == "Qwen2ForCausalLM"
    config = {
        "architectures": [architecture],
        "model_type": "qwen2" if qwen2 else "llama",
        "hidden_size": embd,
        "intermediate_size": ff,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab,
        "tie_word_embeddings": tie_embeddings,
        "bos_token_id": tokenizer.bos,
        "eos_token_id": tokenizer.eos,
        "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype],
        **(config_extra or {}),
    }
    rng = np.random.default_rng(seed)
    stored = _STORED[dtype]

    def matrix(rows: int, cols: int) -> tuple[np.ndarray[Any, Any], str]:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32), stored

    def vector(n: int, fill: float = 1.0) -> tuple[np.ndarray[Any, Any], str]:
        return np.full(n, fill, np.float32), stored

    tensors: dict[str, tuple[np.ndarray[Any, Any], str]] = {
        "model.embed_tokens.weight": matrix(vocab, embd)
    }
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors[f"{p}.input_layernorm.weight"] = vector(embd)
        tensors[f"{p}.self_attn.q_proj.weight"] = matrix(heads * head_dim, embd)
        tensors[f"{p}.self_attn.k_proj.weight"] = matrix(kv_heads * head_dim, embd)
        tensors[f"{p}.self_attn.v_proj.weight"] = matrix(kv_heads * head_dim, embd)
        if qwen2:
            tensors[f"{p}.self_attn.q_proj.bias"] = vector(heads * head_dim, 0.0)
            tensors[f"{p}.self_attn.k_proj.bias"] = vector(kv_heads * head_dim, 0.0)
            tensors[f"{p}.self_attn.v_proj.bias"] = vector(kv_heads * head_dim, 0.0)
        tensors[f"{p}.self_attn.o_proj.weight"] = matrix(embd, heads * head_dim)
        tensors[f"{p}.post_attention_layernorm.weight"] = vector(embd)
        tensors[f"{p}.mlp.gate_proj.weight"] = matrix(ff, embd)
        tensors[f"{p}.mlp.up_proj.weight"] = matrix(ff, embd)
        tensors[f"{p}.mlp.down_proj.weight"] = matrix(embd, ff)
    tensors["model.norm.weight"] = vector(embd)
    if not tie_embeddings:
        tensors["lm_head.weight"] = matrix(vocab, embd)

    files = {"config.json": out / "config.json"}
    files["config.json"].write_text(json.dumps(config))
    for name, content in (
        ("tokenizer.json", tokenizer.tokenizer_json()),
        ("tokenizer_config.json", tokenizer.tokenizer_config_json()),
        ("generation_config.json", {"bos_token_id": tokenizer.bos, "eos_token_id": tokenizer.eos}),
    ):
        files[name] = out / name
        files[name].write_text(json.dumps(content))
    names = list(tensors)
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        files[name] = out / name
        part = names[k * len(names) // shards : (k + 1) * len(names) // shards]
        write_safetensors(files[name], {n: tensors[n] for n in part})
    return files
