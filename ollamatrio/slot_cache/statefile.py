"""The prompt tokens at the head of a llama.cpp slot-state file.

``POST /slots/{id}?action=save`` writes llama.cpp's sequence-state file: the public
``llama_state_seq_save_file`` layout (``llama.h``) of a ``'ggsq'`` magic, a format version,
a token count and that many 32-bit tokens, then the KV data.  Its token array is what the
server handed over, and llama-server (since it learnt multimodal prompts) packs its own
record into it: ``-1``, a record version (``1``), the number of text tokens, the tokens,
then the number of media chunks.  Older servers wrote the bare tokens.

The tokens are what a restore puts back in the slot, so they are the only honest key for
prefix matching (re-tokenizing text would guess at them).  Anything this reader does not
recognise (another record version, media chunks, a count that disagrees with what the
save reported, a short file) reads as ``None``: the state is not kept.  The KV data itself
is llama.cpp's to check when it restores.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array

MAGIC = 0x67677371  # 'ggsq', LLAMA_STATE_SEQ_MAGIC
_HEADER = struct.Struct("<III")  # magic, version, token count
_PACKED_MARK = -1  # llama-server's packed token record starts with this
_PACKED_VERSION = 1
_MAX_TOKENS = 1 << 24  # far beyond any context; guards a corrupt count


def read_state_tokens(
    path: str | os.PathLike[str], expected: int | None = None
) -> list[int] | None:
    """The text tokens saved in the state file at ``path``, or ``None`` when the file is
    not one this reader understands (or holds images).  ``expected`` is the token count
    the save reported (``n_saved``); a different count reads as ``None``."""
    try:
        with open(path, "rb") as file:
            head = file.read(_HEADER.size)
            if len(head) != _HEADER.size:
                return None
            magic, _version, count = _HEADER.unpack(head)
            if magic != MAGIC or count > _MAX_TOKENS:
                return None
            raw = file.read(4 * count)
    except OSError:
        return None
    if len(raw) != 4 * count:
        return None
    values = array("i")
    values.frombytes(raw)
    if values.itemsize != 4:  # pragma: no cover - every platform we run on
        return None
    if sys.byteorder != "little":  # pragma: no cover
        values.byteswap()
    tokens = _unpack(values.tolist())
    if tokens is None or (expected is not None and len(tokens) != expected):
        return None
    return tokens


def _unpack(values: list[int]) -> list[int] | None:
    """The text tokens of llama-server's packed record (or of a bare token array)."""
    if not values or values[0] != _PACKED_MARK:
        return values if all(v >= 0 for v in values) else None
    if len(values) < 4 or values[1] != _PACKED_VERSION:
        return None
    count = values[2]
    if count < 0 or len(values) != 3 + count + 1:
        return None
    if values[3 + count] != 0:  # media chunks: restoring needs the images too
        return None
    tokens = values[3 : 3 + count]
    return tokens if all(v >= 0 for v in tokens) else None
