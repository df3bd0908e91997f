"""Where a loaded shared object keeps the address of a function it imports (ELF64, Linux).

A call from a shared object to a function of another library goes through a slot of its
global offset table, filled by the dynamic linker.  :func:`import_slot` finds that slot in
memory, from the relocation that names the function in the object's file, so that the
runner can put a function of its own between the engine and one it imports
(``runner/threads.py``).  Only the relocations are read (with ``mmap``: the engine's file is
over 100 MB, the tables a few hundred KB of it).
"""

from __future__ import annotations

import ctypes
import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass

_SHT_RELA = 4
_SHT_DYNSYM = 11
# Relocations that fill a slot with a symbol's address: (GLOB_DAT, JUMP_SLOT) per machine.
_SLOT_RELOCATIONS = {62: (6, 7), 183: (1025, 1026)}  # x86-64, AArch64


class ImportSlotError(Exception):
    """The object is not one this reader knows, or does not import the function."""


@dataclass(frozen=True)
class _Section:
    kind: int
    offset: int
    size: int
    link: int


def import_slot(path: str, function: str) -> ctypes.c_void_p:
    """The slot (in this process's memory) through which the object loaded from ``path``
    calls ``function``.  The object must be loaded already; its first exported function
    gives where it was loaded."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        machine = _check_header(elf)
        sections = _sections(elf)
        offset = _relocation_offset(elf, sections, function, _SLOT_RELOCATIONS[machine])
        exported, value = _first_exported(elf, sections)
    library = ctypes.CDLL(path)  # the loaded object: dlopen returns the same handle
    address = ctypes.cast(getattr(library, exported), ctypes.c_void_p).value
    if address is None:
        raise ImportSlotError(f"{exported} has no address in {path}")
    return ctypes.c_void_p.from_address(address - value + offset)


def _check_header(elf: mmap.mmap) -> int:
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ImportSlotError("not a little-endian ELF64 object")
    (machine,) = struct.unpack_from("<H", elf, 0x12)
    if machine not in _SLOT_RELOCATIONS:
        raise ImportSlotError(f"machine {machine} is not one this reader knows")
    return int(machine)


def _sections(elf: mmap.mmap) -> list[_Section]:
    (table,) = struct.unpack_from("<Q", elf, 0x28)
    entry_size, count = struct.unpack_from("<HH", elf, 0x3A)
    sections = []
    for index in range(count):
        _, kind, _, _, offset, size, link = struct.unpack_from(
            "<IIQQQQI", elf, table + index * entry_size
        )
        sections.append(_Section(kind, offset, size, link))
    return sections


def _name(elf: mmap.mmap, strings: _Section, offset: int) -> bytes:
    start = strings.offset + offset
    return elf[start : elf.find(b"\0", start)]


def _symbols(
    elf: mmap.mmap, sections: list[_Section], table: _Section
) -> Iterator[tuple[bytes, int, int, int]]:
    strings = sections[table.link]
    for entry in range(table.offset, table.offset + table.size, 24):
        name, info, _, section, value, _ = struct.unpack_from("<IBBHQQ", elf, entry)
        yield _name(elf, strings, name), info, section, value


def _relocation_offset(
    elf: mmap.mmap, sections: list[_Section], function: str, kinds: tuple[int, int]
) -> int:
    wanted = function.encode()
    for rela in (s for s in sections if s.kind == _SHT_RELA):
        table = sections[rela.link]
        if table.kind != _SHT_DYNSYM:
            continue
        strings = sections[table.link]
        for entry in range(rela.offset, rela.offset + rela.size, 24):
            offset, info, _ = struct.unpack_from("<QQq", elf, entry)
            if info & 0xFFFFFFFF not in kinds:
                continue
            (name,) = struct.unpack_from("<I", elf, table.offset + (info >> 32) * 24)
            if _name(elf, strings, name) == wanted:
                return int(offset)
    raise ImportSlotError(f"the object does not import {function}")


def _first_exported(elf: mmap.mmap, sections: list[_Section]) -> tuple[str, int]:
    for table in (s for s in sections if s.kind == _SHT_DYNSYM):
        for name, info, section, value in _symbols(elf, sections, table):
            global_function = info >> 4 == 1 and info & 0xF == 2  # STB_GLOBAL, STT_FUNC
            if global_function and section != 0 and value and name:
                return name.decode(), int(value)
    raise ImportSlotError("the object exports no function")
