"""Generate a tiny random-weight CLIP vision projector (an ``mmproj`` GGUF) that llama.cpp's
mtmd loads, and tiny PNG images to feed it.

The projector is LLaVA's shape (``clip.projector_type = "mlp"``): a small ViT (patch
embedding, class embedding, positions, pre/post layer norms, ``blocks`` transformer
blocks) and a two-layer MLP (``mm.0``, ``mm.2``) into the text model's embedding width,
which is ``text_embd`` and must match the model it is paired with (mtmd refuses a
mismatch).  Every image becomes ``(image_size / patch_size) ** 2`` embeddings, so a
request with an image gives the model that many more prompt positions.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

ARCH: Final = "clip"
_F32: Final = GGMLQuantizationType.F32
_F16: Final = GGMLQuantizationType.F16


def image_tokens(image_size: int = 32, patch_size: int = 8) -> int:
    """How many embeddings one image becomes with these sizes (the patch grid)."""
    return (image_size // patch_size) ** 2


def write_tiny_clip(
    path: str | os.PathLike[str],
    *,
    text_embd: int = 64,
    embd: int = 32,
    heads: int = 4,
    blocks: int = 1,
    ff: int | None = None,
    image_size: int = 32,
    patch_size: int = 8,
    seed: int = 0,
    name: str = "tiny-clip",
) -> Path:
    """Write a CLIP projector GGUF for a text model of width ``text_embd``; returns its path."""
    if image_size % patch_size or embd % heads:
        raise ValueError("image_size must be a multiple of patch_size, embd of heads")
    out = Path(path)
    ff = 2 * embd if ff is None else ff
    patches = image_tokens(image_size, patch_size)
    writer = GGUFWriter(out, ARCH)
    try:
        _metadata(writer, name, embd, heads, blocks, ff, image_size, patch_size, text_embd)
        rng = np.random.default_rng(seed)
        tensors = list(_tensors(embd, blocks, ff, patch_size, patches, text_embd))
        for tname, shape, qtype in tensors:
            writer.add_tensor(tname, _weights(shape, qtype, rng), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return out


def _metadata(
    w: GGUFWriter,
    name: str,
    embd: int,
    heads: int,
    blocks: int,
    ff: int,
    image_size: int,
    patch_size: int,
    text_embd: int,
) -> None:
    w.add_name(name)
    w.add_type("mmproj")
    w.add_file_type(1)  # mostly F16
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.use_gelu", True)
    w.add_string("clip.projector_type", "mlp")
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.embedding_length", embd)
    w.add_uint32("clip.vision.feed_forward_length", ff)
    w.add_uint32("clip.vision.projection_dim", text_embd)
    w.add_uint32("clip.vision.block_count", blocks)
    w.add_uint32("clip.vision.attention.head_count", heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])


def _tensors(
    embd: int, blocks: int, ff: int, patch: int, patches: int, text_embd: int
) -> Iterator[tuple[str, tuple[int, ...], GGMLQuantizationType]]:
    """(name, numpy shape — the GGUF ``ne`` reversed —, type) of every tensor."""
    yield "v.class_embd", (embd,), _F32
    yield "v.patch_embd.weight", (embd, 3, patch, patch), _F16
    yield "v.position_embd.weight", (patches + 1, embd), _F16
    yield "v.pre_ln.weight", (embd,), _F32
    yield "v.pre_ln.bias", (embd,), _F32
    for i in range(blocks):
        blk = f"v.blk.{i}"
        for proj in ("attn_q", "attn_k", "attn_v", "attn_out"):
            yield f"{blk}.{proj}.weight", (embd, embd), _F16
            yield f"{blk}.{proj}.bias", (embd,), _F32
        for norm in ("ln1", "ln2"):
            yield f"{blk}.{norm}.weight", (embd,), _F32
            yield f"{blk}.{norm}.bias", (embd,), _F32
        yield f"{blk}.ffn_up.weight", (ff, embd), _F16
        yield f"{blk}.ffn_up.bias", (ff,), _F32
        yield f"{blk}.ffn_down.weight", (embd, ff), _F16
        yield f"{blk}.ffn_down.bias", (embd,), _F32
    yield "mm.0.weight", (text_embd, embd), _F16
    yield "mm.0.bias", (text_embd,), _F32
    yield "mm.2.weight", (text_embd, text_embd), _F16
    yield "mm.2.bias", (text_embd,), _F32


def _weights(
    shape: tuple[int, ...], qtype: GGMLQuantizationType, rng: np.random.Generator
) -> np.ndarray[Any, Any]:
    x = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    return x.astype(np.float16) if qtype == _F16 else x


def tiny_png(width: int = 8, height: int = 8, rgb: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    """A valid single-colour RGB PNG (stdlib only: zlib + CRCs)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    row = b"\x00" + bytes(rgb) * width  # filter type 0, then the pixels
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )
