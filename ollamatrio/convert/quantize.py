"""A float GGUF (F32, F16, BF16) rewritten in another type, one tensor at a time.

The types come from :mod:`.policy`; the values from ggml's ``ggml_quantize_chunk`` in the
engine's library for the block types (:mod:`.ggml_quants`: the K-quants and the legacy
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), else from ``gguf.quants.quantize`` (numpy: the legacy block
types and the float types).  The metadata is
copied byte for byte, with ``general.file_type`` set to the target's (so the header says
what the file now holds: ``quantization_level`` in ``/api/show`` and ``/api/tags``) and
``general.alignment`` left out (the output uses the default).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..gguf import TensorInfo, read_gguf
from ..gguf.constants import GGUFValueType
from ..gguf.cursor import Cursor
from .ggml_quants import ggml_quantizer
from .gguf_out import (
    PlannedTensor,
    Progress,
    gguf_string,
    progress,
    write_gguf_copying_metadata,
)
from .policy import ModelShape, Target, TypePlanner
from .rows import Steps, StoredRows, at_once, encode, pread_exactly

_FILE_TYPE = "general.file_type"
_DROPPED_KEYS = (_FILE_TYPE, "general.alignment")
_COPY_CHUNK = 1 << 20


def quantize_gguf(source: Path, output: Path, target: Target) -> Iterator[Progress]:
    """Write ``source`` to ``output`` in ``target``'s types; yields the progress after
    each slice of rows and each tensor written."""
    info = read_gguf(source, cache=False)
    experts = info.metadata.get(f"{info.architecture}.expert_count")
    model = ModelShape.of(
        [t.name for t in info.tensors],
        expert_count=experts if isinstance(experts, int) else 0,
        architecture=info.architecture or "",
    )
    planner = TypePlanner(target, model, k_quants=ggml_quantizer() is not None)
    fd = os.open(source, os.O_RDONLY)
    try:
        metadata: list[Callable[[BinaryIO], None]] = [
            partial(_copy, fd, start, end)
            for key, start, end in _entries(source)
            if key not in _DROPPED_KEYS
        ]
        metadata.append(partial(_uint32, _FILE_TYPE, int(target.file_type)))
        planned = [_planned(fd, info.data_offset, t, planner) for t in info.tensors]
        sizes = {t.name: t.nbytes for t in info.tensors}
        yield from progress(write_gguf_copying_metadata(output, metadata, planned), sizes)
    finally:
        os.close(fd)


def _entries(path: Path) -> Iterator[tuple[str, int, int]]:
    """Each metadata entry's key and byte range (key, type and value) in the file."""
    size = path.stat().st_size
    with open(path, "rb", buffering=0) as f:
        cursor = Cursor(f, path, size)
        cursor.need(24, "header")
        cursor.pos = 16
        for i in range(cursor.u64("metadata key count")):
            start = cursor.offset
            key = cursor.string(f"metadata key #{i}")
            cursor.value(cursor.value_type(f"metadata key {key!r}"), key)
            yield key, start, cursor.offset


def _copy(fd: int, start: int, end: int, out: BinaryIO) -> None:
    for offset in range(start, end, _COPY_CHUNK):
        out.write(pread_exactly(fd, min(_COPY_CHUNK, end - offset), offset))


def _uint32(key: str, value: int, out: BinaryIO) -> None:
    out.write(gguf_string(key) + struct.pack("<II", GGUFValueType.UINT32, value))


def _planned(fd: int, data_offset: int, t: TensorInfo, planner: TypePlanner) -> PlannedTensor:
    new = planner.type_of(t.name, t.shape, t.type)
    offset = data_offset + t.offset
    width = t.shape[0] if t.shape else 1
    rows = t.n_elements // width if width else 0

    def copy() -> Steps:
        return at_once(np.frombuffer(pread_exactly(fd, t.nbytes, offset), np.uint8))

    def convert() -> Steps:
        stored = StoredRows(fd, offset, rows, width, t.type.name)
        return encode(stored.read, rows, width, new)

    return PlannedTensor(t.name, t.shape or (1,), new, copy if new == t.type else convert)
