"""A quantized GGUF dequantized to F16 (vectors F32): a float model to quantize, made from
the one real model the tests have (SmolLM2 Q4_1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.quants import dequantize


def write_f16_copy(source: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write ``source`` with every matrix as F16 and ``general.file_type`` F16."""
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in (
            "general.architecture",
            "general.file_type",
        ):
            continue
        main = field.types[0]
        item = field.types[-1] if main == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), main, sub_type=item)
    writer.add_key_value("general.file_type", int(LlamaFileType.MOSTLY_F16), GGUFValueType.UINT32)
    for t in reader.tensors:
        values: Any = dequantize(np.asarray(t.data), GGMLQuantizationType(t.tensor_type))
        values = values.reshape(tuple(reversed([int(d) for d in t.shape])))
        writer.add_tensor(t.name, values if len(t.shape) < 2 else values.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out)
