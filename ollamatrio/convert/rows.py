"""Tensor rows read from a file as float32 and encoded to a GGUF type, a slice at a time.

A slice is at most :data:`SLICE_ELEMENTS` values, so the float32 copy and the encoder's
temporaries (numpy's quantizers make several arrays the slice's size) stay a few tens of
MiB whatever the tensor: a conversion holds one encoded tensor (the output, at most the
size of the largest tensor) plus one slice in flight.
Reads use ``os.pread`` into fresh buffers, not a memory map, so the pages read are the
process's own only while they are used.

numpy has no bfloat16: a bf16 value is the upper half of a float32's bits, so it widens by a
16-bit shift of its ``uint16`` pattern.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize

from .ggml_quants import GGML_TYPES, ggml_quantizer

#: Values per slice: 1 Mi float32 values are 4 MiB, and the encoder's temporaries about
#: eight times that.  (16 Mi made a 300 MiB peak on SmolLM2's embeddings.)
SLICE_ELEMENTS = 1 << 20

FloatArray = np.ndarray[Any, np.dtype[np.float32]]
ByteArray = np.ndarray[Any, np.dtype[np.uint8]]


def widen_bf16(bits: np.ndarray[Any, np.dtype[np.uint16]]) -> FloatArray:
    """bfloat16 bit patterns as float32 values (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


#: How each storable float type is read: numpy dtype of the stored values, widening.
_READERS: dict[str, tuple[type[np.generic], Callable[[Any], FloatArray]]] = {
    "F32": (np.float32, lambda a: a),
    "F16": (np.float16, lambda a: a.astype(np.float32)),
    "BF16": (np.uint16, widen_bf16),
}


@dataclass(frozen=True)
class StoredRows:
    """A row-major float tensor at ``offset`` in a file: ``rows`` rows of ``width`` values
    stored as ``dtype`` ("F32", "F16" or "BF16")."""

    fd: int
    offset: int
    rows: int
    width: int
    dtype: str

    def read(self, start: int, stop: int) -> FloatArray:
        stored, widen = _READERS[self.dtype]
        item = np.dtype(stored).itemsize
        count = (stop - start) * self.width
        data = pread_exactly(self.fd, count * item, self.offset + start * self.width * item)
        return widen(np.frombuffer(data, stored)).reshape(stop - start, self.width)


def pread_exactly(fd: int, size: int, offset: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    done = 0
    while done < size:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise EOFError(f"file ends at byte {offset + done}, {size - done} bytes short")
        done += n
    return buf


RowSource = Callable[[int, int], FloatArray]


def row_bytes(width: int, qtype: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return width // block * size


Steps = Generator[int, None, ByteArray]
"""A tensor being made: yields the rows done after each slice, returns its bytes."""


def encode(read: RowSource, rows: int, width: int, qtype: GGMLQuantizationType) -> Steps:
    """The whole tensor in ``qtype``'s bytes (rows of ``width`` values), encoded a slice of
    rows at a time from ``read(start, stop)``; yields after each slice, so the caller can
    stop between slices (a create whose client left)."""
    out: ByteArray = np.empty((rows, row_bytes(width, qtype)), np.uint8)
    step = max(1, SLICE_ELEMENTS // max(width, 1))
    encoder = _encoder(qtype)
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        out[start:stop] = encoder(read(start, stop), qtype).reshape(stop - start, -1)
        yield stop
    return out


def _encoder(qtype: GGMLQuantizationType) -> Callable[[FloatArray, Any], ByteArray]:
    """ggml's quantizer for a block type when the engine's library offers it (the only one
    for the K types; for the legacy ones byte for byte numpy's output, several times
    faster), else numpy's (``gguf.quants``: the legacy block types and the floats)."""
    quantizer = ggml_quantizer() if qtype in GGML_TYPES else None
    if quantizer is not None:
        return quantizer.quantize
    return lambda values, t: quantize(values, t).view(np.uint8)


def at_once(data: ByteArray) -> Steps:
    """A tensor already made (copied as it is, or computed), as steps: none."""
    yield from ()
    return data


def made(steps: Steps) -> ByteArray:
    """The tensor ``steps`` make, without stopping between slices."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: ByteArray = done.value
            return result
