"""What a GGUF header says: :class:`GGUFInfo` (metadata, tensors, and the architecture's
hyperparameters derived from them), its tensors' entries, and a vocabulary's duplicate token."""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ollamatrio.errors import GGUFError

from .constants import GGMLQuantizationType, GGUFValueType, Keys, LlamaFileType
from .cursor import SCALARS, ArraySummary, Cursor


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
                parser = Cursor(f, self.path, os.fstat(f.fileno()).st_size)
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
                parser = Cursor(f, self.path, os.fstat(f.fileno()).st_size)
                parser.base = self.summarised_arrays[key]
                if value.item_type == GGUFValueType.STRING:
                    return [
                        text.decode("utf-8", "replace")
                        for text in parser.raw_strings(value.length, key)
                    ]
                fmt = SCALARS[int(value.item_type)]
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
