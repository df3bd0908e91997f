"""A GGUF file written header first, then one tensor at a time.

``gguf.GGUFWriter`` can hold every tensor until the end (``add_tensor`` +
``write_tensors_to_file``); here it only lays out the header: the metadata and every
tensor's name, shape and type go in first (``add_tensor_info``), the header is written, and
each tensor's bytes follow in the same order (``write_tensor_data``) as they are made.  So
a conversion holds one output tensor at a time, never the model.

A file rewritten from another GGUF keeps that file's metadata as bytes
(:func:`write_gguf_copying_metadata`): decoding a vocabulary into Python objects and
encoding it again would cost more memory than the largest tensor (``gguf.GGUFReader``
took 160 MiB for SmolLM2's 49 152 tokens and merges).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf import GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType, GGUFWriter

from .rows import ByteArray, Steps, row_bytes


@dataclass(frozen=True)
class MetadataValue:
    """One metadata entry as GGUF types it (``item_type`` for arrays)."""

    value: Any
    type: GGUFValueType
    item_type: GGUFValueType | None = None


@dataclass(frozen=True)
class Written:
    """How far the writer is: ``rows`` of ``tensor`` made; ``on_disk`` once written."""

    tensor: PlannedTensor
    rows: int
    on_disk: bool = False


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor of the output: ``shape`` in GGUF ``ne`` order (``shape[0]`` is the row
    length), ``make`` makes its bytes when its turn comes (:data:`.rows.Steps`)."""

    name: str
    shape: tuple[int, ...]
    type: GGMLQuantizationType
    make: Callable[[], Steps]

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
) -> Iterator[Written]:
    """Write the file; yields after each slice of a tensor made and each tensor written."""
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
            data = yield from _make(t)
            writer.write_tensor_data(data)
            del data
            yield Written(t, t.rows, on_disk=True)
        writer.flush()
    finally:
        writer.close()


def write_gguf_copying_metadata(
    path: Path,
    metadata: Sequence[Callable[[BinaryIO], None]],
    tensors: Sequence[PlannedTensor],
) -> Iterator[Written]:
    """Write the file with its metadata entries written by ``metadata`` (each writes one
    whole entry: key, type, value); yields as :func:`write_gguf` does."""
    align = GGUF_DEFAULT_ALIGNMENT
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata)))
        for write_entry in metadata:
            write_entry(f)
        offset = 0
        for t in tensors:
            f.write(gguf_string(t.name))
            f.write(struct.pack(f"<I{len(t.shape)}QIQ", len(t.shape), *t.shape, t.type, offset))
            offset += -(-t.nbytes // align) * align
        for t in tensors:
            f.write(bytes(-f.tell() % align))
            data = yield from _make(t)
            data.tofile(f)
            del data
            yield Written(t, t.rows, on_disk=True)
        f.write(bytes(-f.tell() % align))


@dataclass(frozen=True)
class Progress:
    """Bytes of the source's tensors done, of ``total``."""

    done: int
    total: int


def progress(events: Iterator[Written], sizes: Mapping[str, int]) -> Iterator[Progress]:
    """A writer's events as bytes of the source done: ``sizes`` are the source bytes of
    each output tensor (none for one computed, not read)."""
    total, done = sum(sizes.values()), 0
    for w in events:
        size = sizes.get(w.tensor.name, 0)
        if w.on_disk:
            done += size
            yield Progress(done, total)
        else:
            yield Progress(done + size * w.rows // max(w.tensor.rows, 1), total)


def _make(t: PlannedTensor) -> Generator[Written, None, ByteArray]:
    steps = t.make()
    while True:
        try:
            rows = next(steps)
        except StopIteration as done:
            data: ByteArray = done.value
            break
        yield Written(t, rows)
    if data.nbytes != t.nbytes:
        raise ValueError(f"{t.name}: {data.nbytes} bytes made, {t.nbytes} planned")
    return data


def gguf_string(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(8, "little") + data
