"""Header-only GGUF reader: metadata and tensor infos in milliseconds, without the weights.

``gguf.GGUFReader`` builds a numpy view per vocabulary entry and takes seconds on a real model;
the scheduler, memory estimator and ``/api/show`` only need the header.  This reader walks it with
``struct`` over a chunked read buffer (no mmap: a file truncated while mapped would SIGBUS the
server), skips long arrays, and validates every count and length against the file size so a
corrupt or hostile file fails fast with :class:`GGUFError` instead of hanging or allocating.

``read_gguf`` is synchronous and touches the disk: call it from Trio via
``trio.to_thread.run_sync``.  Parsed headers are memoised per file identity; the returned
``GGUFInfo`` is shared, so treat it (including lists inside ``metadata``) as read-only.

The modules: :mod:`.constants` (the ``gguf`` package's enums and tables, without the rest of
that package), :mod:`.cursor` (length-checked reads over a file in chunks), :mod:`.header`
(:class:`GGUFInfo` and the hyperparameters derived from its metadata) and :mod:`.reader`
(:func:`read_gguf`: the whole header validated, and memoised).
"""

from .constants import GGML_QUANT_SIZES, GGMLQuantizationType
from .cursor import ArraySummary
from .header import DuplicateToken, GGUFInfo, TensorInfo
from .reader import is_gguf, read_gguf

__all__ = [
    "GGML_QUANT_SIZES",
    "ArraySummary",
    "DuplicateToken",
    "GGMLQuantizationType",
    "GGUFInfo",
    "TensorInfo",
    "is_gguf",
    "read_gguf",
]
