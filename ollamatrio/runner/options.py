"""What the runner is told, and the load-time decisions Ollama makes before launching llama.cpp.

Pure code (no xllamacpp import): the client builds a :class:`RunnerConfig`, the runner child
turns it plus a few facts about the model and the machine into a :class:`LoadPlan` with
:func:`plan_load`, so every rule is table-testable without loading anything.

Bn codes in this module name Ollama's behaviours, each defined in docs/behaviours.md.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ollamatrio.kv_cache import requested_kv_types, usable_kv_types
from ollamatrio.types import LoadSpec

POOLING_TYPES = ("none", "mean", "cls", "last", "rank")
EMBEDDING_BATCH_CAP = 2048

# B58: case-insensitive substrings that mark an out-of-memory failure.
OOM_MARKERS = (
    "out of memory",
    "out of device memory",
    "cudamalloc failed",
    "hipmalloc failed",
    "failed to allocate",
    "allocation failed",
    "not enough memory",
    "insufficient memory",
    "vk_error_out_of_device_memory",
    "erroroutofmemory",
)


def is_oom(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in OOM_MARKERS)


@dataclass(frozen=True)
class RunnerConfig:
    """The runner's instructions: the first line of its stdin, as JSON (never argv)."""

    spec: LoadSpec
    api_key: str
    socket_dir: str  # private 0700 directory made by the client; holds the socket and load log
    parent_pid: int = 0  # the client's pid (0: the runner's parent at start)
    verbosity: int = 1  # llama.cpp log level: 1 errors, 2 warnings, 3 info
    slot_save_dir: str = ""  # where llama.cpp may save and restore slots (the prompt cache)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> RunnerConfig:
        raw: dict[str, Any] = json.loads(text)
        spec = dict(raw.pop("spec"))
        for key in ("tensor_split", "gpu_ids", "adapters"):
            spec[key] = tuple(spec.get(key, ()))
        return cls(spec=LoadSpec(**spec), **raw)


@dataclass(frozen=True)
class GpuFacts:
    """What decides flash-attention support for one GPU (B62)."""

    library: str  # CUDA | ROCm | Vulkan | Metal
    compute_major: int = 0
    compute_minor: int = 0
    driver_major: int = 0

    @property
    def supports_flash_attention(self) -> bool:
        if self.library != "CUDA":
            return True
        compute = (self.compute_major, self.compute_minor)
        return compute >= (6, 0) and compute != (7, 2) and self.driver_major >= 7


@dataclass(frozen=True)
class ModelFacts:
    train_ctx: int = 0  # <arch>.context_length; 0 if absent
    pooling: str | None = None  # <arch>.pooling_type, named; present means an embedding model
    file_size: int = 0
    head_dim_k: int = 0  # per attention head; 0: unknown
    head_dim_v: int = 0


@dataclass(frozen=True)
class LoadPlan:
    """The exact llama.cpp load parameters, after Ollama's rules."""

    ctx_per_slot: int
    n_ctx: int  # total, ctx_per_slot * n_parallel
    n_parallel: int
    n_batch: int
    n_ubatch: int
    flash_attention: str  # auto | on | off
    kv_cache_type_k: str
    kv_cache_type_v: str
    use_mmap: bool
    embedding: bool
    pooling: str | None  # None: llama.cpp's default for the model
    n_gpu_layers: int
    warnings: tuple[str, ...] = ()


def plan_load(
    spec: LoadSpec,
    model: ModelFacts,
    *,
    gpus: tuple[GpuFacts, ...] = (),
    free_ram: int = 0,
) -> LoadPlan:
    """Apply Ollama's load-time rules (B14, B37, B38, B62, llm/server.go) to ``spec``.

    ``gpus`` are the devices this load may use (empty: CPU only); ``free_ram`` is free host
    memory in bytes (0: unknown).
    """
    warnings: list[str] = []
    n_parallel = max(1, spec.num_parallel)

    ctx = max(1, spec.num_ctx)
    if model.train_ctx > 0 and ctx > model.train_ctx:
        warnings.append(
            "requested context size too large for model: "
            f"num_ctx={ctx} n_ctx_train={model.train_ctx}"
        )
        ctx = model.train_ctx

    batch = max(1, min(spec.num_batch, ctx))
    embedding_model = model.pooling is not None
    if embedding_model and batch < ctx:
        # Non-causal models must see a whole input in one batch.
        batch = max(batch, min(ctx, EMBEDDING_BATCH_CAP))
    batch = min(batch, ctx * n_parallel)

    uses_gpu = spec.num_gpu != 0 and bool(gpus)
    fa_supported = all(g.supports_flash_attention for g in gpus) if uses_gpu else True
    if spec.flash_attention is None:
        flash = "auto" if fa_supported else "off"
    elif spec.flash_attention and not fa_supported:
        warnings.append("flash attention enabled but not supported by gpu")
        flash = "off"
    else:
        flash = "on" if spec.flash_attention else "off"

    # Each side's type, or f16 for a side llama.cpp would refuse (one warning line).
    wanted = requested_kv_types(
        [{"kv_cache_type_k": spec.kv_cache_type_k, "kv_cache_type_v": spec.kv_cache_type_v}],
        spec.kv_cache_type or "f16",
    )
    kv, kv_warning = usable_kv_types(
        wanted,
        flash_attention=flash == "on",
        head_dim_k=model.head_dim_k,
        head_dim_v=model.head_dim_v,
    )
    if kv_warning is not None:
        warnings.append(kv_warning)

    use_mmap = spec.use_mmap
    if use_mmap and not uses_gpu:
        use_mmap = False  # CPU loads: allocate real memory, not file cache
    if use_mmap and 0 < free_ram < model.file_size:
        use_mmap = False  # mmap of a model bigger than free RAM thrashes

    pooling = spec.pooling or model.pooling
    if spec.embedding and pooling in (None, "none"):
        # The OpenAI embeddings path needs pooled vectors (engine.md §3).
        pooling = "mean"
    if pooling is not None and pooling not in POOLING_TYPES:
        warnings.append(f"unknown pooling type {pooling!r}; using the model's")
        pooling = None

    return LoadPlan(
        ctx_per_slot=ctx,
        n_ctx=ctx * n_parallel,
        n_parallel=n_parallel,
        n_batch=batch,
        n_ubatch=batch,
        flash_attention=flash,
        kv_cache_type_k=kv.k,
        kv_cache_type_v=kv.v,
        use_mmap=use_mmap,
        embedding=spec.embedding or embedding_model,
        pooling=pooling,
        n_gpu_layers=spec.num_gpu if uses_gpu else 0,
        warnings=tuple(warnings),
    )
