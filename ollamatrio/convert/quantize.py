"""A float GGUF (F32, F16, BF16) rewritten in another type, one tensor at a time.

The types come from :mod:`.policy`; the values from ``gguf.quants.quantize`` (numpy; the
legacy block types Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, and the float types).  The metadata is
copied as it is, with ``general.file_type`` set to the target's, so the header says what
the file now holds (``quantization_level`` in ``/api/show`` and ``/api/tags``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, ReaderTensor

from .gguf_out import MetadataValue, PlannedTensor, write_gguf
from .policy import ModelShape, Target, tensor_type
from .rows import ByteArray, StoredRows, encode, pread_exactly

_DROPPED_KEYS = ("general.alignment",)  # the output uses the default alignment


@dataclass(frozen=True)
class Progress:
    """Bytes of the source's tensors done, of ``total``."""

    done: int
    total: int


def quantize_gguf(source: Path, output: Path, target: Target) -> Iterator[Progress]:
    """Write ``source`` to ``output`` in ``target``'s types; yields after each tensor."""
    reader = GGUFReader(source)
    metadata = _metadata(reader, target)
    architecture = str(metadata["general.architecture"].value)
    names = {t.name for t in reader.tensors}
    experts = metadata.get(f"{architecture}.expert_count")
    model = ModelShape(
        has_output="output.weight" in names,
        expert_count=int(experts.value) if experts is not None else 0,
    )
    total = sum(int(t.n_bytes) for t in reader.tensors)
    fd = os.open(source, os.O_RDONLY)
    try:
        planned = [_planned(fd, t, target, model) for t in reader.tensors]
        sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
        done = 0
        for written in write_gguf(output, architecture, metadata, planned):
            done += sizes[written.name]
            yield Progress(done, total)
    finally:
        os.close(fd)


def _metadata(reader: GGUFReader, target: Target) -> dict[str, MetadataValue]:
    out: dict[str, MetadataValue] = {}
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in _DROPPED_KEYS:
            continue
        main = field.types[0]
        item = field.types[-1] if main == GGUFValueType.ARRAY else None
        out[field.name] = MetadataValue(field.contents(), main, item)
    out["general.file_type"] = MetadataValue(int(target.file_type), GGUFValueType.UINT32)
    return out


def _planned(fd: int, t: ReaderTensor, target: Target, model: ModelShape) -> PlannedTensor:
    shape = tuple(int(d) for d in t.shape)  # ne order
    current = GGMLQuantizationType(t.tensor_type)
    new = tensor_type(t.name, shape, current, target, model)
    offset, nbytes = int(t.data_offset), int(t.n_bytes)
    width = shape[0]
    rows = int(t.n_elements) // width if width else 0

    def copy() -> ByteArray:
        return np.frombuffer(pread_exactly(fd, nbytes, offset), np.uint8)

    def convert() -> ByteArray:
        stored = StoredRows(fd, offset, rows, width, current.name)
        return encode(stored.read, rows, width, new)

    return PlannedTensor(t.name, shape, new, copy if new == current else convert)
