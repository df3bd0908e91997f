"""A GGUF file written header first, then one tensor at a time.

``gguf.GGUFWriter`` can hold every tensor until the end (``add_tensor`` +
``write_tensors_to_file``); here it only lays out the header: the metadata and every
tensor's name, shape and type go in first (``add_tensor_info``), the header is written, and
each tensor's bytes follow in the same order (``write_tensor_data``) as they are made.  So
a conversion holds one output tensor at a time, never the model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from .rows import ByteArray, row_bytes


@dataclass(frozen=True)
class MetadataValue:
    """One metadata entry as GGUF types it (``item_type`` for arrays)."""

    value: Any
    type: GGUFValueType
    item_type: GGUFValueType | None = None


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor of the output: ``shape`` in GGUF ``ne`` order (``shape[0]`` is the row
    length), ``make`` gives its bytes when its turn comes."""

    name: str
    shape: tuple[int, ...]
    type: GGMLQuantizationType
    make: Callable[[], ByteArray]

    @property
    def rows(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.rows * row_bytes(self.shape[0], self.type)


def write_gguf(
    path: Path,
    architecture: str,
    metadata: Mapping[str, MetadataValue],
    tensors: Sequence[PlannedTensor],
) -> Iterator[PlannedTensor]:
    """Write the file; yields each tensor once its bytes are on disk."""
    writer = GGUFWriter(path, architecture)
    try:
        for key, entry in metadata.items():
            if key != "general.architecture":  # the writer's own first entry
                writer.add_key_value(key, entry.value, entry.type, sub_type=entry.item_type)
        for t in tensors:
            # numpy order, with the raw type: the shape is the logical one (not bytes).
            shape = tuple(reversed(t.shape))
            writer.add_tensor_info(t.name, shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in tensors:
            data = t.make()
            if data.nbytes != t.nbytes:
                raise ValueError(f"{t.name}: {data.nbytes} bytes made, {t.nbytes} planned")
            writer.write_tensor_data(data)
            del data
            yield t
        writer.flush()
    finally:
        writer.close()
