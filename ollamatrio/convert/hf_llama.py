"""A Hugging Face llama-family config as a GGUF's hyperparameters, and its tensors' GGUF
names and layouts.

``LlamaForCausalLM`` (Llama, SmolLM2, and the Mistral checkpoints published under it),
``MistralForCausalLM`` and ``Qwen2ForCausalLM`` share one layout; they differ in two things
only: Qwen2 has biases on its q/k/v projections (the name map handles them), and llama's
rotary embedding pairs dimensions differently from the checkpoint, so llama's q and k rows
are permuted as ``convert_hf_to_gguf.py`` does (Qwen2 uses the NeoX pairing, stored as is).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import MODEL_ARCH, GGUFValueType, TensorNameMap

from ..errors import InvalidRequestError
from .gguf_out import MetadataValue
from .rows import FloatArray

V = GGUFValueType

#: ``architectures[0]`` of config.json -> the GGUF architecture.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}
_ARCH_ENUMS = {"llama": MODEL_ARCH.LLAMA, "qwen2": MODEL_ARCH.QWEN2}
#: Checkpoint tensors llama.cpp computes itself.
_SKIPPED = re.compile(r"(rotary_emb\.inv_freq|\.attention\.masked_bias|\.attention\.bias)$")


def architecture_of(config: Mapping[str, Any]) -> str:
    """The GGUF architecture for ``config.json``; a 400 naming any other."""
    names = config.get("architectures")
    name = names[0] if isinstance(names, list) and names else None
    if not isinstance(name, str):
        raise InvalidRequestError("unknown architecture: config.json names none")
    if name not in ARCHITECTURES:
        supported = ", ".join(ARCHITECTURES)
        raise InvalidRequestError(
            f'unsupported architecture "{name}": converting supports {supported}'
        )
    return ARCHITECTURES[name]


@dataclass(frozen=True)
class Hyperparameters:
    arch: str
    layers: int
    embd: int
    heads: int
    kv_heads: int
    vocab_size: int

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Hyperparameters:
        def number(key: str, default: int | None = None) -> int:
            value = config.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidRequestError(f"config.json: {key} must be a positive integer")
            return value

        heads = number("num_attention_heads")
        return cls(
            arch=architecture_of(config),
            layers=number("num_hidden_layers"),
            embd=number("hidden_size"),
            heads=heads,
            kv_heads=number("num_key_value_heads", heads),
            vocab_size=number("vocab_size"),
        )


def model_metadata(config: Mapping[str, Any], hp: Hyperparameters) -> dict[str, MetadataValue]:
    """The ``<arch>.*`` hyperparameters (Ollama's ``llamaModel.KV``, llama.cpp's keys)."""
    arch = hp.arch
    md: dict[str, MetadataValue] = {
        f"{arch}.vocab_size": MetadataValue(hp.vocab_size, V.UINT32),
        f"{arch}.block_count": MetadataValue(hp.layers, V.UINT32),
        f"{arch}.embedding_length": MetadataValue(hp.embd, V.UINT32),
        f"{arch}.attention.head_count": MetadataValue(hp.heads, V.UINT32),
        f"{arch}.attention.head_count_kv": MetadataValue(hp.kv_heads, V.UINT32),
    }
    head_dim = config.get("head_dim")
    for key, value, vtype in (
        ("context_length", config.get("max_position_embeddings"), V.UINT32),
        ("feed_forward_length", config.get("intermediate_size"), V.UINT32),
        ("rope.freq_base", config.get("rope_theta"), V.FLOAT32),
        ("attention.layer_norm_rms_epsilon", config.get("rms_norm_eps"), V.FLOAT32),
        ("attention.key_length", head_dim, V.UINT32),
        ("attention.value_length", head_dim, V.UINT32),
    ):
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            md[f"{arch}.{key}"] = MetadataValue(value, vtype)
    rope_dim = head_dim if isinstance(head_dim, int) and head_dim > 0 else hp.embd // hp.heads
    md[f"{arch}.rope.dimension_count"] = MetadataValue(rope_dim, V.UINT32)
    scaling = config.get("rope_scaling")
    if isinstance(scaling, Mapping) and scaling.get("type", scaling.get("rope_type")) == "linear":
        md[f"{arch}.rope.scaling.type"] = MetadataValue("linear", V.STRING)
        md[f"{arch}.rope.scaling.factor"] = MetadataValue(float(scaling["factor"]), V.FLOAT32)
    elif _rope_type(config) not in (None, "default", "llama3"):
        raise InvalidRequestError(f'unsupported rope scaling "{_rope_type(config)}" in config.json')
    return md


def _rope_type(config: Mapping[str, Any]) -> str | None:
    scaling = config.get("rope_scaling")
    if not isinstance(scaling, Mapping):
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    return str(kind) if kind is not None else None


def rope_factors(config: Mapping[str, Any], hp: Hyperparameters) -> FloatArray | None:
    """Llama 3.1's frequency factors (``rope_freqs.weight``, which llama.cpp applies) for
    ``rope_type: llama3``, as ``convert_hf_to_gguf.py`` and Ollama compute them."""
    scaling = config.get("rope_scaling")
    if hp.arch != "llama" or _rope_type(config) != "llama3" or not isinstance(scaling, Mapping):
        return None
    base = float(config.get("rope_theta", 10000.0))
    head_dim = config.get("head_dim")
    dim = head_dim if isinstance(head_dim, int) and head_dim > 0 else hp.embd // hp.heads
    factor = float(scaling.get("factor", 8.0))
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    original = float(scaling.get("original_max_position_embeddings", 8192))
    wavelengths = 2 * np.pi * base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    smooth = (original / wavelengths - low) / (high - low)
    factors = np.where(
        wavelengths < original / high,
        1.0,
        np.where(wavelengths > original / low, factor, 1 / ((1 - smooth) / factor + smooth)),
    )
    return factors.astype(np.float32)


class TensorNames:
    """Checkpoint tensor names -> GGUF names (the ``gguf`` package's map)."""

    def __init__(self, hp: Hyperparameters) -> None:
        self._map = TensorNameMap(_ARCH_ENUMS[hp.arch], hp.layers)

    def gguf_name(self, name: str) -> str | None:
        """The GGUF name; None for a tensor llama.cpp does not load; a 400 if unknown."""
        if _SKIPPED.search(name):
            return None
        found = self._map.get_name(name, try_suffixes=(".weight", ".bias"))
        if found is None:
            raise InvalidRequestError(
                f"cannot convert tensor {name!r}: unknown to its architecture"
            )
        return found


def needs_permute(hp: Hyperparameters, gguf_name: str) -> int | None:
    """For llama's ``attn_q``/``attn_k`` weights, the head count to permute their rows
    by; None for any other tensor."""
    if hp.arch != "llama":
        return None
    if gguf_name.endswith(".attn_q.weight"):
        return hp.heads
    if gguf_name.endswith(".attn_k.weight"):
        return hp.kv_heads
    return None


def permute_rows(weights: FloatArray, heads: int) -> FloatArray:
    """``convert_hf_to_gguf.py``'s ``LlamaModel.permute``: within each head, the rows of
    the two rotary halves interleaved."""
    rows = weights.shape[0]
    if rows % (2 * heads):
        raise InvalidRequestError(f"cannot split {rows} attention rows into {heads} heads")
    return np.ascontiguousarray(
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )
