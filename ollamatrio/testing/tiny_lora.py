"""Tiny LoRA adapters for the models ``write_tiny_gguf`` makes (Modelfile ``ADAPTER``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np


def write_tiny_lora(
    path: str | os.PathLike[str],
    *,
    layers: int = 2,
    embd: int = 64,
    rank: int = 4,
    alpha: float = 16.0,
    targets: Sequence[str] = ("attn_q", "attn_v"),
    scale: float = 0.5,
    seed: int = 1,
) -> Path:
    """Write a llama LoRA adapter in llama.cpp's GGUF form: ``general.type = adapter``,
    ``adapter.type = lora`` and, per target weight ``W`` (ne ``[n_in, n_out]``), tensors
    ``W.lora_a`` (ne ``[n_in, rank]``) and ``W.lora_b`` (ne ``[rank, n_out]``).  ``layers``
    and ``embd`` must match the base model; targets must be square ``embd × embd`` weights
    (attn_q, attn_output, and attn_k/attn_v when the model has as many KV heads as heads)."""
    out = Path(path)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for i in range(layers):
        for target in targets:
            name = f"blk.{i}.{target}.weight"
            # numpy shapes are the GGUF ne reversed
            lora_a = rng.standard_normal((rank, embd)) * scale
            lora_b = rng.standard_normal((embd, rank)) * scale
            writer.add_tensor(f"{name}.lora_a", lora_a.astype(np.float32))
            writer.add_tensor(f"{name}.lora_b", lora_b.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
