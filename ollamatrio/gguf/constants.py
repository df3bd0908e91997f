"""The ``gguf`` package's enums and tables (value types, quantization types and their block
sizes, metadata keys), loaded without the rest of that package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING


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
