"""A forward cursor over a GGUF file, read in chunks: the length-prefixed strings, scalars and
arrays of the format, each checked against the file's size, long arrays summarised."""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

from ollamatrio.errors import GGUFError

from .constants import GGUFValueType

#: Arrays longer than these are summarised (vocabularies, merges, scores), not decoded.
#: Numeric arrays get a higher limit so per-layer hyperparameters are always kept.
MAX_DECODED_STRINGS: Final = 64
MAX_DECODED_NUMBERS: Final = 1024
#: Sanity limits far above any real model; they bound the work a hostile header can cause.
MAX_STRING_BYTES: Final = 64 * 1024 * 1024
MAX_STRING_ITEMS: Final = 1 << 24

_CHUNK: Final = 1 << 20

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
SCALARS: Final[Mapping[int, struct.Struct]] = {
    int(t): struct.Struct("<" + code) for t, code in _SCALAR_CODES.items()
}
_VALUE_TYPES: Final = frozenset(int(t) for t in GGUFValueType)


@dataclass(frozen=True, slots=True)
class ArraySummary:
    """A metadata array too long to decode (e.g. a vocabulary): its item type and length."""

    item_type: GGUFValueType
    length: int

    def __len__(self) -> int:
        return self.length


class Cursor:
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
        fmt = SCALARS[vtype]
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
        fmt = SCALARS[item_type]
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
