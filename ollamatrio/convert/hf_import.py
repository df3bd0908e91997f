"""A Hugging Face model folder's files (``config.json``, ``tokenizer.json``,
``tokenizer_config.json``, ``*.safetensors`` shards) written as one GGUF.

Matrices become F16 (BF16 when the checkpoint stores BF16, which F16 cannot always hold),
vectors F32, as Ollama's converter writes them; a ``quantize`` asked for follows as a
second pass over the result (:mod:`.quantize`).  Each tensor is read from its shard when
its turn comes, a slice of rows at a time (:mod:`.rows`), so the model is never in memory.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, LlamaFileType

from ..errors import InvalidRequestError
from .gguf_out import MetadataValue, PlannedTensor, Progress, progress, write_gguf
from .hf_llama import (
    Hyperparameters,
    TensorNames,
    model_metadata,
    needs_permute,
    permute_rows,
    rope_factors,
)
from .hf_tokenizer import check_tokenizer, tokenizer_metadata
from .rows import Steps, StoredRows, at_once, encode
from .safetensors import ITEM_SIZES, StoredTensor, read_header

T = GGMLQuantizationType
CONFIG, TOKENIZER, TOKENIZER_CONFIG = "config.json", "tokenizer.json", "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"


def read_json(files: Mapping[str, Path], name: str, *, required: bool) -> dict[str, Any]:
    path = files.get(name)
    if path is None:
        if required:
            raise InvalidRequestError(f"{name} is required to convert a safetensors model")
        return {}
    try:
        value = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{name} is not a JSON object")
    return value


def check_folder(files: Mapping[str, Path]) -> Hyperparameters:
    """Everything that can be checked before a tensor is read: the files there, a known
    architecture, a config that says its shape, a tokenizer of a kind converted, shard
    headers whose tensors the architecture knows, in types converted; a 400 otherwise."""
    hp = Hyperparameters.of(read_json(files, CONFIG, required=True))
    if TOKENIZER not in files:
        if "tokenizer.model" in files:
            raise InvalidRequestError(
                "unsupported tokenizer: tokenizer.model (SentencePiece) is not converted; "
                "tokenizer.json is required"
            )
        raise InvalidRequestError(f"{TOKENIZER} is required to convert a safetensors model")
    if not any(name.endswith(".safetensors") for name in files):
        raise InvalidRequestError("no .safetensors files were given")
    check_tokenizer(read_json(files, TOKENIZER, required=True))
    _sources(files, hp)
    return hp


@dataclass(frozen=True)
class _Source:
    gguf_name: str
    tensor: StoredTensor
    permute_heads: int | None


def convert_folder(files: Mapping[str, Path], output: Path) -> Iterator[Progress]:
    """Write the GGUF for ``files`` (request name -> file) to ``output``; yields the
    progress after each slice of rows and each tensor written."""
    hp = check_folder(files)
    config = read_json(files, CONFIG, required=True)
    sources = _sources(files, hp)
    embedding = next((s for s in sources if s.gguf_name == "token_embd.weight"), None)
    if embedding is None:
        raise InvalidRequestError("the checkpoint has no token embeddings")
    n_vocab = embedding.tensor.shape[0]
    template_path = files.get(CHAT_TEMPLATE)
    tokenizer = tokenizer_metadata(
        read_json(files, TOKENIZER, required=True),
        read_json(files, TOKENIZER_CONFIG, required=False),
        config,
        template_path.read_text() if template_path is not None else None,
        n_vocab,
    )
    n_tokens = len(tokenizer["tokenizer.ggml.tokens"].value)
    if n_tokens != n_vocab:
        raise InvalidRequestError(
            f"the tokenizer has {n_tokens} tokens but the embeddings have {n_vocab} rows"
        )
    bf16 = any(s.tensor.dtype == "BF16" and len(s.tensor.shape) >= 2 for s in sources)
    file_type = LlamaFileType.MOSTLY_BF16 if bf16 else LlamaFileType.MOSTLY_F16
    metadata: dict[str, MetadataValue] = {
        "general.architecture": MetadataValue(hp.arch, GGUFValueType.STRING),
        "general.file_type": MetadataValue(int(file_type), GGUFValueType.UINT32),
        "general.quantization_version": MetadataValue(2, GGUFValueType.UINT32),
        **model_metadata(config, hp),
        f"{hp.arch}.vocab_size": MetadataValue(n_vocab, GGUFValueType.UINT32),
        **tokenizer,
    }
    with ExitStack() as stack:
        fds: dict[Path, int] = {}
        for s in sources:
            if s.tensor.path not in fds:
                fds[s.tensor.path] = fd = os.open(s.tensor.path, os.O_RDONLY)
                stack.callback(os.close, fd)
        planned = [*_computed(config, hp), *(_planned(s, fds[s.tensor.path]) for s in sources)]
        sizes = {s.gguf_name: s.tensor.n_elements * ITEM_SIZES[s.tensor.dtype] for s in sources}
        yield from progress(write_gguf(output, hp.arch, metadata, planned), sizes)


def _computed(config: Mapping[str, Any], hp: Hyperparameters) -> list[PlannedTensor]:
    """Tensors the checkpoint does not hold but llama.cpp reads: Llama 3.1's rope factors."""
    factors = rope_factors(config, hp)
    if factors is None:
        return []
    data = factors.view(np.uint8)
    return [PlannedTensor("rope_freqs.weight", (len(factors),), T.F32, lambda: at_once(data))]


def _sources(files: Mapping[str, Path], hp: Hyperparameters) -> list[_Source]:
    names = TensorNames(hp)
    found: dict[str, _Source] = {}
    for shown in sorted(n for n in files if n.endswith(".safetensors")):
        for tensor in read_header(files[shown], shown):
            gguf_name = names.gguf_name(tensor.name)
            if gguf_name is None:
                continue
            if gguf_name in found:
                raise InvalidRequestError(f"tensor {tensor.name!r} appears twice")
            found[gguf_name] = _Source(gguf_name, tensor, needs_permute(hp, gguf_name))
    return sorted(found.values(), key=lambda s: _order(s.gguf_name))


def _order(name: str) -> tuple[int, int, str]:
    # token_embd first, the blocks in order, then the output norm and projection.
    if name.startswith("token_embd"):
        return (0, 0, name)
    if m := re.match(r"blk\.(\d+)\.", name):
        return (1, int(m.group(1)), name)
    return (2, 0, name)


def _planned(source: _Source, fd: int) -> PlannedTensor:
    t = source.tensor
    shape = t.shape or (1,)
    width = shape[-1]
    rows = t.n_elements // width if width else 0
    # Vectors stay F32; matrices F16, or BF16 as stored (F16 cannot hold every BF16).
    out_type = T.F32 if len(shape) < 2 else (T.BF16 if t.dtype == "BF16" else T.F16)
    stored = StoredRows(fd, t.offset, rows, width, t.dtype)

    def make() -> Steps:
        if source.permute_heads is None:
            return encode(stored.read, rows, width, out_type)
        whole = permute_rows(stored.read(0, rows), source.permute_heads)
        return encode(lambda a, b: whole[a:b], rows, width, out_type)

    return PlannedTensor(source.gguf_name, tuple(reversed(shape)), out_type, make)
