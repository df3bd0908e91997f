"""Test support: generated GGUF models of any shape, size or defect."""

from __future__ import annotations

from ollamatrio.testing.tiny_clip import tiny_png, write_tiny_clip
from ollamatrio.testing.tiny_gguf import (
    CHATML,
    CORRUPTIONS,
    Corruption,
    Dtype,
    MetadataValue,
    Pooling,
    write_tiny_gguf,
)
from ollamatrio.testing.tiny_lora import write_tiny_lora
from ollamatrio.testing.tiny_reranker import write_tiny_reranker
from ollamatrio.testing.vocab import TokenizerKind

__all__ = [
    "CHATML",
    "CORRUPTIONS",
    "Corruption",
    "Dtype",
    "MetadataValue",
    "Pooling",
    "TokenizerKind",
    "tiny_png",
    "write_tiny_clip",
    "write_tiny_gguf",
    "write_tiny_lora",
    "write_tiny_reranker",
]
