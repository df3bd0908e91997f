"""Header-only GGUF reader: metadata and tensor infos in milliseconds, without the weights.

``gguf.GGUFReader`` builds a numpy view per vocabulary entry and takes seconds on a real model;
the scheduler, memory estimator and ``/api/show`` only need the header.  This reader walks it with
``struct`` over a chunked read buffer (no mmap: a file truncated while mapped would SIGBUS the
server), skips long arrays, and validates every count and length against the file size so a
corrupt or hostile file fails fast with :class:`GGUFError` instead of hanging or allocating.

``read_gguf`` is synchronous and touches the disk: call it from Trio via
``trio.to_thread.run_sync``.  Parsed headers are memoised per file identity; the returned
``GGUFInfo`` is shared, so treat it (including lists inside ``metadata``) as read-only.
"""

from __future__ import annotations

import importlib.util
import os
import struct
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, BinaryIO, Final

from ollamatrio.errors import GGUFError


def _gguf_constants() -> ModuleType:
    """The ``gguf`` package's ``constants`` module alone (enums and tables, standard library
    only).  The package's ``__init__`` imports its reader, writer, vocabularies and metadata,
    and with them numpy, sentencepiece and yaml: 0.15 s and 10 MiB that a header reader never
    needs.  The module is registered under its own name, so a later ``import gguf`` (the
    writer in :mod:`ollamatrio.testing`) uses this same module and its enums."""
    name = "gguf.constants"
    if name not in sys.modules:
        package = importlib.util.find_spec("gguf")  # finds it without running its __init__
        assert package is not None
        assert package.submodule_search_locations
        path = Path(package.submodule_search_locations[0]) / "constants.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


if TYPE_CHECKING:
    from gguf.constants import GGML_QUANT_SIZES as GGML_QUANT_SIZES
    from gguf.constants import GGUF_DEFAULT_ALIGNMENT as GGUF_DEFAULT_ALIGNMENT
    from gguf.constants import GGMLQuantizationType as GGMLQuantizationType
    from gguf.constants import GGUFValueType as GGUFValueType
    from gguf.constants import Keys as Keys
    from gguf.constants import LlamaFileType as LlamaFileType
else:
    _constants = _gguf_constants()
    GGML_QUANT_SIZES = _constants.GGML_QUANT_SIZES
    GGUF_DEFAULT_ALIGNMENT = _constants.GGUF_DEFAULT_ALIGNMENT
    GGMLQuantizationType = _constants.GGMLQuantizationType
    GGUFValueType = _constants.GGUFValueType
    Keys = _constants.Keys
    LlamaFileType = _constants.LlamaFileType

__all__ = ["ArraySummary", "DuplicateToken", "GGUFInfo", "TensorInfo", "is_gguf", "read_gguf"]

MAGIC: Final = b"GGUF"
SUPPORTED_VERSIONS: Final = (2, 3)
#: Arrays longer than these are summarised (vocabularies, merges, scores), not decoded.
#: Numeric arrays get a higher limit so per-layer hyperparameters are always kept.
MAX_DECODED_STRINGS: Final = 64
MAX_DECODED_NUMBERS: Final = 1024
#: Sanity limits far above any real model; they bound the work a hostile header can cause.
MAX_STRING_BYTES: Final = 64 * 1024 * 1024
MAX_STRING_ITEMS: Final = 1 << 24
MAX_KV_COUNT: Final = 1 << 16
MAX_TENSOR_COUNT: Final = 1 << 20
MAX_DIMS: Final = 4  # GGML_MAX_DIMS
MAX_ELEMENTS: Final = (1 << 63) - 1  # llama.cpp stores element counts in int64

_CHUNK: Final = 1 << 20
_HEADER_BYTES: Final = 24  # magic, version, tensor count, kv count
_MIN_KV_BYTES: Final = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_BYTES: Final = 8 + 4 + 4 + 8  # name length, n_dims, type, offset

_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")

_SCALAR_CODES: Final[Mapping[GGUFValueType, str]] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
_SCALARS: Final[Mapping[int, struct.Struct]] = {
    int(t): struct.Struct("<" + code) for t, code in _SCALAR_CODES.items()
}
_VALUE_TYPES: Final = frozenset(int(t) for t in GGUFValueType)
_TENSOR_TYPES: Final = frozenset(int(t) for t in GGMLQuantizationType)


@dataclass(frozen=True, slots=True)
class ArraySummary:
    """A metadata array too long to decode (e.g. a vocabulary): its item type and length."""

    item_type: GGUFValueType
    length: int

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor's header entry; ``offset`` is relative to ``GGUFInfo.data_offset``."""

    name: str
    type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF ``ne`` order: shape[0] is the contiguous row length
    offset: int
    nbytes: int
    layer: int | None  # N for ``blk.N.*`` tensors

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


PerLayer = int | tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DuplicateToken:
    """A token text the vocabulary lists at two ids (llama.cpp cannot load such a file)."""

    text: str
    first: int
    second: int

    def __str__(self) -> str:
        return (
            f"duplicate token {self.text!r} in the vocabulary (ids {self.first} and "
            f"{self.second}): llama.cpp cannot load it"
        )


@dataclass(frozen=True, eq=False)
class GGUFInfo:
    """Everything in a GGUF header, plus the derived hyperparameters callers ask for."""

    path: Path
    version: int
    file_size: int
    data_offset: int  # absolute file offset where tensor data starts
    alignment: int
    metadata: Mapping[str, Any]  # every key; long arrays as ArraySummary
    tensors: tuple[TensorInfo, ...]
    #: File offset of the first item of each string array (to read one again in full).
    string_arrays: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    #: File offset of the first item of each array summarised in ``metadata``.
    summarised_arrays: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    # -- architecture hyperparameters ------------------------------------------------------

    @property
    def architecture(self) -> str:
        """``general.architecture``; ``"unknown"`` when absent, as Ollama reports it."""
        arch = self.metadata.get(Keys.General.ARCHITECTURE)
        return arch if isinstance(arch, str) else "unknown"

    @property
    def name(self) -> str | None:
        value = self.metadata.get(Keys.General.NAME)
        return value if isinstance(value, str) else None

    @property
    def block_count(self) -> int:
        return self._arch_int(Keys.LLM.BLOCK_COUNT) or 0

    @property
    def context_length(self) -> int:
        """Training context length (0 when the file does not say)."""
        return self._arch_int(Keys.LLM.CONTEXT_LENGTH) or 0

    @property
    def embedding_length(self) -> int:
        return self._arch_int(Keys.LLM.EMBEDDING_LENGTH) or 0

    @property
    def feed_forward_length(self) -> PerLayer:
        """An int, or one value per layer for models that vary it (0 when absent)."""
        return self._per_layer(Keys.LLM.FEED_FORWARD_LENGTH, 0)

    @property
    def head_count(self) -> PerLayer:
        return self._per_layer(Keys.Attention.HEAD_COUNT, 0)

    @property
    def head_count_kv(self) -> PerLayer:
        """Defaults to ``head_count`` when absent, as llama.cpp does."""
        value = self._arch(Keys.Attention.HEAD_COUNT_KV)
        return self.head_count if value is None else _per_layer_value(value)

    @property
    def key_length(self) -> int | None:
        return self._arch_int(Keys.Attention.KEY_LENGTH)

    @property
    def value_length(self) -> int | None:
        return self._arch_int(Keys.Attention.VALUE_LENGTH)

    @property
    def vocab_size(self) -> int:
        """``<arch>.vocab_size``, else the token list's length, else token_embd's rows."""
        size = self._arch_int(Keys.LLM.VOCAB_SIZE)
        if size is not None:
            return size
        tokens = self.metadata.get(Keys.Tokenizer.LIST)
        if isinstance(tokens, (list, ArraySummary)):
            return len(tokens)
        embd = self.tensor("token_embd.weight")
        return embd.shape[1] if embd is not None and len(embd.shape) >= 2 else 0

    @property
    def file_type(self) -> int | None:
        """``general.file_type`` (a ``gguf.LlamaFileType`` value)."""
        value = self.metadata.get(Keys.General.FILE_TYPE)
        return value if isinstance(value, int) else None

    @property
    def file_type_name(self) -> str | None:
        """Ollama's quantization label, e.g. ``Q4_K_M``, ``F16``; None if unknown."""
        ft = self.file_type
        if ft is None:
            return None
        try:
            name = LlamaFileType(ft).name
        except ValueError:
            return None
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get(Keys.Tokenizer.CHAT_TEMPLATE)
        return value if isinstance(value, str) else None

    @property
    def pooling_type(self) -> int | None:
        """``<arch>.pooling_type`` (a ``gguf.PoolingType`` value) for embedding models."""
        return self._arch_int(Keys.LLM.POOLING_TYPE)

    @property
    def sliding_window(self) -> int | None:
        return self._arch_int(Keys.Attention.SLIDING_WINDOW)

    @property
    def sliding_window_pattern(self) -> int | tuple[int, ...] | None:
        """An interval, or one flag per layer (1 = sliding-window layer)."""
        value = self._arch(Keys.Attention.SLIDING_WINDOW_PATTERN)
        return None if value is None else _per_layer_value(value)

    @property
    def ssm_conv_kernel(self) -> int | None:
        return self._arch_int(Keys.SSM.CONV_KERNEL)

    @property
    def ssm_inner_size(self) -> int | None:
        return self._arch_int(Keys.SSM.INNER_SIZE)

    @property
    def ssm_state_size(self) -> int | None:
        return self._arch_int(Keys.SSM.STATE_SIZE)

    @property
    def ssm_group_count(self) -> int | None:
        return self._arch_int(Keys.SSM.GROUP_COUNT)

    @cached_property
    def duplicate_token(self) -> DuplicateToken | None:
        """The first token string the vocabulary lists twice, or None.

        llama.cpp maps token text to id and aborts the whole process
        (``GGML_ASSERT(id_to_token.size() == token_to_id.size())``) when two ids share a
        text, so such a file can never load.  It compares the raw bytes and names an empty
        token ``[EMPTY_<id>]``; so does this.  Reads the token list from the file once
        (tens of milliseconds for a 150,000-token vocabulary): call it in a worker thread.
        """
        offset = self.string_arrays.get(Keys.Tokenizer.LIST)
        if offset is None or self.metadata.get(Keys.Tokenizer.MODEL) in ("none", "no_vocab"):
            return None
        count = len(self.metadata[Keys.Tokenizer.LIST])
        seen: dict[bytes, int] = {}
        try:
            with open(self.path, "rb", buffering=0) as f:
                parser = _Parser(f, self.path, os.fstat(f.fileno()).st_size)
                parser.base = offset
                for index, text in enumerate(parser.raw_strings(count, Keys.Tokenizer.LIST)):
                    if not text:
                        text = f"[EMPTY_{index}]".encode()
                    first = seen.setdefault(text, index)
                    if first != index:
                        return DuplicateToken(text.decode("utf-8", "replace"), first, index)
        except OSError as exc:
            raise GGUFError(f"{self.path}: read failed: {exc.strerror or exc}") from exc
        return None

    def full_array(self, key: str) -> list[Any]:
        """Metadata array ``key`` in full, also one the header summarised (a vocabulary, its
        merges and token types): read from the file again, tens of milliseconds for
        150,000 tokens, so call it in a worker thread.  Strings are decoded as UTF-8 with
        replacement, as Go's JSON encoder writes invalid bytes."""
        value = self.metadata[key]
        if not isinstance(value, ArraySummary):
            return list(value)
        try:
            with open(self.path, "rb", buffering=0) as f:
                parser = _Parser(f, self.path, os.fstat(f.fileno()).st_size)
                parser.base = self.summarised_arrays[key]
                if value.item_type == GGUFValueType.STRING:
                    return [
                        text.decode("utf-8", "replace")
                        for text in parser.raw_strings(value.length, key)
                    ]
                fmt = _SCALARS[int(value.item_type)]
                parser.need(value.length * fmt.size, f"array {key!r}")
                return list(
                    struct.unpack_from(f"<{value.length}{fmt.format[1:]}", parser.buf, parser.pos)
                )
        except OSError as exc:
            raise GGUFError(f"{self.path}: read failed: {exc.strerror or exc}") from exc

    # -- tensors ---------------------------------------------------------------------------

    @cached_property
    def parameter_count(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @cached_property
    def tensor_bytes(self) -> int:
        """Sum of all tensors' byte sizes (without alignment padding)."""
        return sum(t.nbytes for t in self.tensors)

    def layer_tensors(self) -> dict[int, list[TensorInfo]]:
        """``blk.N.*`` tensors grouped by N, in layer order."""
        layers: dict[int, list[TensorInfo]] = {}
        for t in self.tensors:
            if t.layer is not None:
                layers.setdefault(t.layer, []).append(t)
        return dict(sorted(layers.items()))

    def non_layer_tensors(self) -> list[TensorInfo]:
        """Tensors outside the repeating blocks: embeddings, output norm and head, etc."""
        return [t for t in self.tensors if t.layer is None]

    def tensor(self, name: str) -> TensorInfo | None:
        return self._tensors_by_name.get(name)

    @cached_property
    def _tensors_by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}

    # -- helpers ---------------------------------------------------------------------------

    def _arch(self, key_template: str) -> Any:
        return self.metadata.get(key_template.format(arch=self.architecture))

    def _arch_int(self, key_template: str) -> int | None:
        value = self._arch(key_template)
        return value if isinstance(value, int) else None

    def _per_layer(self, key_template: str, default: int) -> PerLayer:
        value = self._arch(key_template)
        return default if value is None else _per_layer_value(value)


def _per_layer_value(value: int | Sequence[int]) -> PerLayer:
    return value if isinstance(value, int) else tuple(int(v) for v in value)


# -- reading ---------------------------------------------------------------------------------


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


class _Parser:
    """A forward cursor over the file's header, read in chunks into ``buf``.

    ``base`` is the file offset of ``buf[0]``; ``pos`` indexes ``buf`` and may run past its
    end after a skip, in which case the next read refills from ``base + pos``.
    """

    __slots__ = ("base", "buf", "file", "path", "pos", "size")

    def __init__(self, file: BinaryIO, path: Path, size: int) -> None:
        self.file = file
        self.path = path
        self.size = size
        self.buf = b""
        self.base = 0
        self.pos = 0

    def error(self, message: str) -> GGUFError:
        return GGUFError(f"{self.path}: {message}")

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def need(self, n: int, what: str) -> None:
        """Make ``buf[pos:pos + n]`` available, or fail if the file ends first."""
        if self.pos + n <= len(self.buf):
            return
        start = self.base + self.pos
        if start + n > self.size:
            raise self.error(
                f"truncated: {what} needs {n} bytes at offset {start}, "
                f"but the file ends at {self.size}"
            )
        self.file.seek(start)
        data = self.file.read(max(n, _CHUNK))
        if data is None or len(data) < n:  # the file shrank under us
            raise self.error(f"truncated: short read at offset {start} while reading {what}")
        self.buf, self.base, self.pos = data, start, 0

    def u32(self, what: str) -> int:
        self.need(4, what)
        value: int = _U32.unpack_from(self.buf, self.pos)[0]
        self.pos += 4
        return value

    def u64(self, what: str) -> int:
        self.need(8, what)
        value: int = _U64.unpack_from(self.buf, self.pos)[0]
        self.pos += 8
        return value

    def string(self, what: str) -> str:
        return self.raw_string(what).decode("utf-8", errors="replace")

    def raw_string(self, what: str) -> bytes:
        n = self.u64(what)
        if n > MAX_STRING_BYTES:
            raise self.error(
                f"implausible header: {what} claims a {n}-byte string at offset "
                f"{self.offset - 8} (limit {MAX_STRING_BYTES})"
            )
        if self.offset + n > self.size:
            raise self.error(
                f"truncated: {what} is a {n}-byte string at offset {self.offset - 8}, "
                f"but the file ends at {self.size}"
            )
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw

    def raw_strings(self, n: int, key: str) -> Iterator[bytes]:
        """``n`` length-prefixed strings as bytes: the vocabulary's hot loop, as
        :meth:`skip_strings` (items whole in the buffer are sliced straight out of it)."""
        unpack = _U64.unpack_from
        done = 0
        while done < n:
            buf, pos = self.buf, self.pos
            end = len(buf)
            while done < n and pos + 8 <= end:
                start = pos + 8
                stop = start + unpack(buf, pos)[0]
                if stop > end:
                    break
                yield buf[start:stop]
                pos = stop
                done += 1
            self.pos = pos
            if done < n:  # the next item crosses the buffer's end: read it the slow way
                yield self.raw_string(f"item of {key!r}")
                done += 1

    # -- metadata values ------------------------------------------------------------------

    def value_type(self, what: str) -> int:
        vtype = self.u32(what)
        if vtype not in _VALUE_TYPES:
            raise self.error(f"{what} has unknown value type {vtype}")
        return vtype

    def value(self, vtype: int, key: str) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string(f"value of {key!r}")
        if vtype == GGUFValueType.ARRAY:
            return self.array(key)
        fmt = _SCALARS[vtype]
        self.need(fmt.size, f"value of {key!r}")
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value

    def array(self, key: str) -> list[Any] | ArraySummary:
        item_type = self.value_type(f"array {key!r}")
        if item_type == GGUFValueType.ARRAY:
            raise self.error(f"array {key!r} nests arrays, which GGUF readers do not support")
        n = self.u64(f"array {key!r}")
        remaining = self.size - self.offset
        if item_type == GGUFValueType.STRING:
            if n > MAX_STRING_ITEMS or n * 8 > remaining:
                raise self.error(
                    f"implausible header: array {key!r} claims {n} strings but only "
                    f"{remaining} bytes remain in the file"
                )
            if n <= MAX_DECODED_STRINGS:
                return [self.string(f"item of {key!r}") for _ in range(n)]
            self.skip_strings(n, key)
            return ArraySummary(GGUFValueType(item_type), n)
        fmt = _SCALARS[item_type]
        nbytes = n * fmt.size
        if nbytes > remaining:
            raise self.error(
                f"implausible header: array {key!r} claims {n} items ({nbytes} bytes) but only "
                f"{remaining} bytes remain in the file"
            )
        if n <= MAX_DECODED_NUMBERS:
            self.need(nbytes, f"array {key!r}")
            items = struct.unpack_from(f"<{n}{fmt.format[1:]}", self.buf, self.pos)
            self.pos += nbytes
            return list(items)
        self.pos += nbytes  # bounds checked above; the next read refills
        return ArraySummary(GGUFValueType(item_type), n)

    def skip_strings(self, n: int, key: str) -> None:
        """Step over ``n`` length-prefixed strings: the hot loop for vocabularies.

        No bounds check per item: ``unpack_from`` raises ``struct.error`` when a length prefix
        lies beyond the buffer, and only then do we refill (the shared iterator resumes).
        """
        unpack = _U64.unpack_from
        items = iter(range(n))
        buf, pos = self.buf, self.pos
        while True:
            try:
                for _ in items:
                    pos += 8 + unpack(buf, pos)[0]
                break
            except (struct.error, OverflowError):  # OverflowError: pos beyond ssize_t
                self.pos = pos
                self.need(8, f"string length in {key!r}")
                buf, pos = self.buf, self.pos
                pos += 8 + unpack(buf, pos)[0]  # the item whose read failed
        self.pos = pos
        if self.offset > self.size:
            raise self.error(f"truncated: array {key!r} runs past the end of the file")

    # -- the whole header -----------------------------------------------------------------

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
