"""Rows quantized by ggml itself: ``ggml_quantize_chunk`` in the engine's shared library.

The ``gguf`` package's numpy quantizers make only the legacy block types (Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1); the K-quants (Q4_K, Q5_K, Q6_K, ...) exist only in ggml's C.  The engine's
library (``xllamacpp``'s extension module) exports ggml's public C functions, so they are
called here through ``ctypes`` on float32 rows, without importing ``xllamacpp`` (a plain
``dlopen``: no Python module initialised, no backend started).

Safety: the call runs in the server's process, as Ollama runs the same function in its own
(``ml/backend/ggml``'s ``Quantize``).  What could make ggml abort or write out of bounds is
checked before each call: the library is taken only if its type numbers, block sizes and
row sizes are the ones the ``gguf`` package knows (a mismatch would write a wrong layout);
the source is a C-contiguous float32 array of whole rows; a row is a whole number of the
type's blocks (ggml asserts it); the destination is a fresh buffer of exactly
``nrows * ggml_row_size(type, n_per_row)`` bytes; types that need an importance matrix are
never asked for.  ``ctypes`` releases the GIL for the call, so other threads run meanwhile.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType

#: The types asked of ggml: the legacy block types and the K-quants of Ollama's mixes.
GGML_TYPES = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K)

FloatArray = np.ndarray[Any, np.dtype[np.float32]]
ByteArray = np.ndarray[Any, np.dtype[np.uint8]]


class GGMLQuantizer:
    """ggml's quantizer in a loaded library whose types were checked."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._chunk = lib.ggml_quantize_chunk
        self._chunk.restype = ctypes.c_size_t
        self._chunk.argtypes = [
            ctypes.c_int,  # enum ggml_type
            ctypes.c_void_p,  # const float * src
            ctypes.c_void_p,  # void * dst
            ctypes.c_int64,  # start
            ctypes.c_int64,  # nrows
            ctypes.c_int64,  # n_per_row
            ctypes.c_void_p,  # const float * imatrix
        ]
        self._row_size = lib.ggml_row_size
        self._row_size.restype = ctypes.c_size_t
        self._row_size.argtypes = [ctypes.c_int, ctypes.c_int64]

    def row_size(self, qtype: GGMLQuantizationType, width: int) -> int:
        return int(self._row_size(int(qtype), width))

    def quantize(self, rows: FloatArray, qtype: GGMLQuantizationType) -> ByteArray:
        """``rows`` (2-D float32) in ``qtype``'s bytes, one output row per input row."""
        if qtype not in GGML_TYPES:
            raise ValueError(f"{qtype.name} is not quantized through ggml here")
        if rows.ndim != 2:
            raise ValueError(f"rows must be 2-D, not {rows.ndim}-D")
        nrows, width = rows.shape
        block = GGML_QUANT_SIZES[qtype][0]
        if width == 0 or width % block:
            raise ValueError(f"a row of {width} values is not whole {qtype.name} blocks")
        src = np.ascontiguousarray(rows, dtype=np.float32)
        row_size = self.row_size(qtype, width)
        out: ByteArray = np.empty((nrows, row_size), np.uint8)
        if nrows == 0:
            return out
        written = self._chunk(int(qtype), src.ctypes.data, out.ctypes.data, 0, nrows, width, None)
        if written != out.nbytes:
            raise RuntimeError(f"ggml wrote {written} bytes of {qtype.name}, {out.nbytes} due")
        return out


@cache
def ggml_quantizer() -> GGMLQuantizer | None:
    """The engine library's quantizer, or None when the library is absent, lacks a symbol
    or numbers its types otherwise than the ``gguf`` package (checked once)."""
    path = _engine_library()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        if not _types_agree(lib):
            return None
        return GGMLQuantizer(lib)
    except (OSError, AttributeError):
        return None


def _engine_library() -> Path | None:
    try:
        spec = importlib.util.find_spec("xllamacpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("xllamacpp*.so"))
        if found:
            return found[0]
    return None


def _types_agree(lib: ctypes.CDLL) -> bool:
    """Each type's number names the same type, block and size in ggml as in ``gguf``."""
    name, blck, size = lib.ggml_type_name, lib.ggml_blck_size, lib.ggml_type_size
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    blck.restype, blck.argtypes = ctypes.c_int64, [ctypes.c_int]
    size.restype, size.argtypes = ctypes.c_size_t, [ctypes.c_int]
    needs_imatrix = lib.ggml_quantize_requires_imatrix
    needs_imatrix.restype, needs_imatrix.argtypes = ctypes.c_bool, [ctypes.c_int]
    for qtype in GGML_TYPES:
        raw = name(int(qtype))
        if raw is None or raw.decode().upper() != qtype.name:
            return False
        if (blck(int(qtype)), size(int(qtype))) != GGML_QUANT_SIZES[qtype]:
            return False
        if needs_imatrix(int(qtype)):
            return False
    return True
