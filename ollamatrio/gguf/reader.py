"""Reading a GGUF file's header: :func:`read_gguf` validates it whole (magic, version, counts,
metadata types, tensor entries) into a :class:`~.header.GGUFInfo`, memoised per file identity;
:func:`is_gguf` looks at the magic alone."""

from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from ollamatrio.errors import GGUFError

from .constants import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGMLQuantizationType,
    GGUFValueType,
    Keys,
)
from .cursor import ArraySummary, Cursor
from .header import GGUFInfo, TensorInfo

MAGIC: Final = b"GGUF"
SUPPORTED_VERSIONS: Final = (2, 3)
#: Sanity limits far above any real model; they bound the work a hostile header can cause.
MAX_KV_COUNT: Final = 1 << 16
MAX_TENSOR_COUNT: Final = 1 << 20
MAX_DIMS: Final = 4  # GGML_MAX_DIMS
MAX_ELEMENTS: Final = (1 << 63) - 1  # llama.cpp stores element counts in int64

_HEADER_BYTES: Final = 24  # magic, version, tensor count, kv count
_MIN_KV_BYTES: Final = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_BYTES: Final = 8 + 4 + 4 + 8  # name length, n_dims, type, offset

_TENSOR_TYPES: Final = frozenset(int(t) for t in GGMLQuantizationType)


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a readable regular file starting with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def read_gguf(path: str | os.PathLike[str], *, cache: bool = True) -> GGUFInfo:
    """Read and validate a GGUF file's header; raises :class:`GGUFError` on any defect.

    Results are memoised per file identity (path, device, inode, size, mtime, ctime), so
    re-reading an unchanged model costs one ``fstat``; ``cache=False`` always parses.
    OS errors (missing file, permissions, a directory) are reported as ``GGUFError`` too,
    with the ``OSError`` as ``__cause__``.
    """
    p = Path(path)
    try:
        f = open(p, "rb", buffering=0)  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise GGUFError(f"{p}: cannot open: {exc.strerror or exc}") from exc
    with f:
        try:
            st = os.fstat(f.fileno())
            key = (str(p), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if cache and (info := _cache.get(key)) is not None:
                return info
            info = _Parser(f, p, st.st_size).parse()
        except OSError as exc:
            raise GGUFError(f"{p}: read failed: {exc.strerror or exc}") from exc
    if cache:
        _cache.put(key, info)
    return info


class _InfoCache:
    """A small LRU of parsed headers, shared by the worker threads that call ``read_gguf``."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[Hashable, GGUFInfo] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> GGUFInfo | None:
        with self._lock:
            info = self._entries.get(key)
            if info is not None:
                self._entries.move_to_end(key)
            return info

    def put(self, key: Hashable, info: GGUFInfo) -> None:
        with self._lock:
            self._entries[key] = info
            self._entries.move_to_end(key)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)


_cache = _InfoCache(capacity=64)


class _Parser(Cursor):
    """The cursor that reads a whole header into a :class:`GGUFInfo`."""

    __slots__ = ()

    def parse(self) -> GGUFInfo:
        magic = b""
        if self.size >= len(MAGIC):
            self.need(len(MAGIC), "magic")
            magic = self.buf[: len(MAGIC)]
        if magic != MAGIC:
            found = f"starts with {magic!r}" if magic else f"only {self.size} bytes long"
            raise self.error(f"not a GGUF file ({found}, expected magic {MAGIC!r})")
        self.pos = 4
        version = self.u32("version")
        if version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in SUPPORTED_VERSIONS:
                raise self.error(f"big-endian GGUF (version {swapped}) is not supported")
            raise self.error(
                f"unsupported GGUF version {version} (supported: "
                f"{', '.join(map(str, SUPPORTED_VERSIONS))})"
            )
        n_tensors = self.u64("tensor count")
        n_kv = self.u64("metadata key count")
        self.check_counts(n_tensors, n_kv)

        metadata: dict[str, Any] = {}
        string_arrays: dict[str, int] = {}
        for i in range(n_kv):
            key = self.string(f"metadata key #{i}")
            if key in metadata:
                raise self.error(f"duplicate metadata key {key!r}")
            vtype = self.value_type(f"metadata key {key!r}")
            if vtype == GGUFValueType.ARRAY:
                string_arrays[key] = self.offset + 12  # past the item type and count
            metadata[key] = self.value(vtype, key)
        _check_known_keys(self, metadata)
        alignment = metadata.get(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise self.error(f"general.alignment must be a power of two, got {alignment!r}")

        tensors = [self.tensor_info(i) for i in range(n_tensors)]
        data_offset = -(-self.offset // alignment) * alignment
        self.check_tensors(tensors, data_offset, alignment)
        return GGUFInfo(
            path=self.path,
            version=version,
            file_size=self.size,
            data_offset=data_offset,
            alignment=alignment,
            metadata=MappingProxyType(metadata),
            tensors=tuple(tensors),
            string_arrays=MappingProxyType(
                {
                    key: offset
                    for key, offset in string_arrays.items()
                    if _is_string_array(metadata[key])
                }
            ),
            summarised_arrays=MappingProxyType(
                {
                    key: offset
                    for key, offset in string_arrays.items()
                    if isinstance(metadata[key], ArraySummary)
                }
            ),
        )

    def check_counts(self, n_tensors: int, n_kv: int) -> None:
        room = self.size - _HEADER_BYTES
        if n_kv > MAX_KV_COUNT or n_tensors > MAX_TENSOR_COUNT:
            raise self.error(
                f"implausible header: {n_tensors} tensors and {n_kv} metadata keys "
                f"(limits {MAX_TENSOR_COUNT} and {MAX_KV_COUNT})"
            )
        if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_BYTES > room:
            raise self.error(
                f"implausible header: {n_tensors} tensors and {n_kv} metadata keys cannot fit "
                f"in a {self.size}-byte file"
            )

    def tensor_info(self, index: int) -> TensorInfo:
        name = self.string(f"tensor #{index} name")
        what = f"tensor {name!r}"
        n_dims = self.u32(what)
        if n_dims > MAX_DIMS:
            raise self.error(f"{what} has {n_dims} dimensions (at most {MAX_DIMS})")
        self.need(8 * n_dims + 12, what)
        shape = struct.unpack_from(f"<{n_dims}Q", self.buf, self.pos)
        self.pos += 8 * n_dims
        type_id = self.u32(what)
        offset = self.u64(what)
        if type_id not in _TENSOR_TYPES:
            raise self.error(f"{what} has unknown tensor type {type_id}")
        ttype = GGMLQuantizationType(type_id)
        block_size, type_size = GGML_QUANT_SIZES[ttype]
        n_elements = 1
        for d in shape:
            n_elements *= d
        if n_elements > MAX_ELEMENTS:
            raise self.error(f"{what} has an implausible shape {list(shape)}")
        if shape and shape[0] % block_size:
            raise self.error(
                f"{what} of type {ttype.name} has row length {shape[0]}, "
                f"not a multiple of its block size {block_size}"
            )
        return TensorInfo(
            name=name,
            type=ttype,
            shape=shape,
            offset=offset,
            nbytes=n_elements // block_size * type_size,
            layer=_layer_of(name),
        )

    def check_tensors(self, tensors: list[TensorInfo], data_offset: int, alignment: int) -> None:
        seen: set[str] = set()
        for t in tensors:
            if t.name in seen:
                raise self.error(f"duplicate tensor name {t.name!r}")
            seen.add(t.name)
            if t.offset % alignment:
                raise self.error(
                    f"tensor {t.name!r} offset {t.offset} is not a multiple of the "
                    f"alignment {alignment}"
                )
            end = data_offset + t.offset + t.nbytes
            if end > self.size:
                raise self.error(
                    f"truncated: tensor {t.name!r} data ends at byte {end}, beyond the end of "
                    f"the file ({self.size} bytes)"
                )


def _layer_of(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    index, dot, _ = name[4:].partition(".")
    return int(index) if dot and index.isascii() and index.isdigit() else None


# Keys whose values the derived properties interpret: checked once at read time so the
# properties can trust their types.
_INT_KEYS: Final = (
    Keys.LLM.BLOCK_COUNT,
    Keys.LLM.CONTEXT_LENGTH,
    Keys.LLM.EMBEDDING_LENGTH,
    Keys.LLM.VOCAB_SIZE,
    Keys.LLM.POOLING_TYPE,
    Keys.Attention.KEY_LENGTH,
    Keys.Attention.VALUE_LENGTH,
    Keys.Attention.SLIDING_WINDOW,
    Keys.SSM.CONV_KERNEL,
    Keys.SSM.INNER_SIZE,
    Keys.SSM.STATE_SIZE,
    Keys.SSM.GROUP_COUNT,
)
_PER_LAYER_KEYS: Final = (
    Keys.LLM.FEED_FORWARD_LENGTH,
    Keys.Attention.HEAD_COUNT,
    Keys.Attention.HEAD_COUNT_KV,
    Keys.Attention.SLIDING_WINDOW_PATTERN,
)


def _check_known_keys(parser: _Parser, metadata: Mapping[str, Any]) -> None:
    def expect(key: str, ok: bool, wanted: str) -> None:
        if not ok:
            value = metadata[key]
            shown = f"{type(value).__name__} {value!r}"[:80]
            raise parser.error(f"metadata key {key!r} should be {wanted}, got {shown}")

    for key in (Keys.General.ARCHITECTURE, Keys.Tokenizer.CHAT_TEMPLATE):
        if key in metadata:
            expect(key, isinstance(metadata[key], str), "a string")
    if Keys.General.FILE_TYPE in metadata:
        expect(Keys.General.FILE_TYPE, _is_int(metadata[Keys.General.FILE_TYPE]), "an integer")
    arch = metadata.get(Keys.General.ARCHITECTURE)
    if not isinstance(arch, str):
        return
    for template in _INT_KEYS:
        key = template.format(arch=arch)
        if key in metadata:
            expect(key, _is_int(metadata[key]), "an integer")
    for template in _PER_LAYER_KEYS:
        key = template.format(arch=arch)
        if key in metadata:
            value = metadata[key]
            ok = _is_int(value) or (
                isinstance(value, list) and all(isinstance(v, int) for v in value)
            )
            expect(key, ok, "an integer or a per-layer integer array")


def _is_string_array(value: object) -> bool:
    if isinstance(value, ArraySummary):
        return value.item_type == GGUFValueType.STRING
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
