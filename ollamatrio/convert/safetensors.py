"""A safetensors shard's header: each tensor's dtype, shape and bytes, checked against the
file.  The format: an 8-byte little-endian header length, the JSON header, then the data,
each tensor's ``data_offsets`` relative to the end of the header."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidRequestError

#: Header lengths past this are not a real model's (the format's own limit is 100 MB).
MAX_HEADER = 100_000_000
ITEM_SIZES = {"F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a shard: ``offset`` is absolute in the file."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]  # as stored (PyTorch order: the last dimension is the row)
    offset: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def read_header(path: Path, shown: str) -> list[StoredTensor]:
    """The tensors of the shard at ``path`` (``shown``: its name in the request)."""

    def bad(reason: str) -> InvalidRequestError:
        return InvalidRequestError(f"invalid safetensors file {shown}: {reason}")

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise bad("too short")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise bad(f"header length {length} does not fit the file")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise bad(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise bad("header is not an object")
    base = 8 + length
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise bad(f"tensor {name!r} has no dtype, shape and data_offsets") from None
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise bad(f"tensor {name!r} has invalid data_offsets")
        if dtype not in ITEM_SIZES:
            raise bad(f"tensor {name!r} is {dtype}: only F32, F16 and BF16 can be converted")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise bad(f"tensor {name!r} has an invalid shape {shape!r}")
        t = StoredTensor(name, path, dtype, tuple(shape), base + begin)
        if end - begin != t.n_elements * ITEM_SIZES[dtype] or base + end > size:
            raise bad(f"tensor {name!r}: data_offsets {[begin, end]} do not match its shape")
        tensors.append(t)
    return tensors
