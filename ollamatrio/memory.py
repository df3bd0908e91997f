"""Predict what a model costs in memory, and lay its layers out over GPUs.

:func:`estimate` turns a GGUF header plus load options into byte counts: weights per layer,
the KV cache per layer, the compute buffers, the logits buffer and the runner's fixed cost.
:func:`plan_layout` then decides how many layers each GPU takes for the free memory given.
Both are pure and fast (the scheduler calls them on its hot path): everything derived from
the header alone is computed once per :class:`~ollamatrio.gguf.GGUFInfo` and cached.

The formulas, their constants and the measurements behind them are in ``docs/memory.md``.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from ollamatrio.gguf import GGML_QUANT_SIZES, ArraySummary, GGMLQuantizationType, GGUFInfo
from ollamatrio.kv_cache import KvCacheTypes, requested_kv_types, usable_kv_types
from ollamatrio.types import MemoryUsage

__all__ = [
    "Estimate",
    "Layout",
    "MemoryOptions",
    "ModelProfile",
    "draft_bytes",
    "estimate",
    "gpu_context_reserve",
    "kv_bytes_per_element",
    "plan_layout",
    "profile",
]

MiB: Final = 1 << 20

#: llama.cpp pads every KV cache stream to a multiple of 256 cells.
KV_PAD: Final = 256
#: Fixed resident memory of a runner process with a model loaded: the interpreter, trio,
#: psutil, pynvml, gguf (numpy) and the xllamacpp library, plus llama.cpp's server threads.
#: Measured as RSS minus llama.cpp's own buffers on a 300-token model.
RUNNER_OVERHEAD: Final = 47 * MiB
#: VRAM a runner process holds on each GPU it may use, beyond llama.cpp's buffers: the CUDA
#: context and cuBLAS workspace.  Measured on an H100 (CUDA 13): 546 MiB with a 0.1 MB model
#: (ctx 2048, 1 slot), 550 MiB with ctx 8192 and 4 slots.  ROCm and Vulkan are unmeasured and
#: booked like CUDA; Metal shares the host's memory.
GPU_CONTEXT_RESERVE: Final[Mapping[str, int]] = {
    "CUDA": 546 * MiB,
    "ROCm": 546 * MiB,
    "Vulkan": 546 * MiB,
    "Metal": 0,
}
#: llama.cpp's in-memory vocabulary: bytes per token and per BPE merge rule (measured).
VOCAB_TOKEN_BYTES: Final = 220
VOCAB_MERGE_BYTES: Final = 300
#: Per-token graph inputs besides the mask (positions, token and output ids), measured.
GRAPH_INPUT_BYTES: Final = 40
#: The runner raises the batch of embedding models to the whole input, up to this.
EMBEDDING_BATCH_CAP: Final = 2048

# Architectures whose sliding-window layer pattern llama.cpp hard-codes when the file does
# not carry ``<arch>.attention.sliding_window_pattern``: every n-th layer is global.
_SWA_PERIODS: Final[Mapping[str, int]] = {
    "gemma2": 2,
    "gemma3": 6,
    "gemma3n": 5,
    "cohere2": 4,
    "gpt-oss": 2,
    "exaone4": 4,
}
_KV_TYPES: Final[Mapping[str, GGMLQuantizationType]] = {
    name: GGMLQuantizationType[name.upper()]
    for name in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
}


def gpu_context_reserve(library: str) -> int:
    """Bytes a runner holds on each GPU of ``library`` before loading anything."""
    return GPU_CONTEXT_RESERVE.get(library, GPU_CONTEXT_RESERVE["CUDA"])


def kv_bytes_per_element(kv_cache_type: str) -> float:
    """Bytes per cached K or V element: f16 2, q8_0 34/32, q4_0 18/32."""
    block, size = GGML_QUANT_SIZES[_kv_type(kv_cache_type)]
    return size / block


def _kv_type(name: str) -> GGMLQuantizationType:
    try:
        return _KV_TYPES[name.lower() or "f16"]
    except KeyError:
        raise ValueError(
            f"unknown KV cache type {name!r}; choose from {', '.join(_KV_TYPES)}"
        ) from None


def _row_bytes(qtype: GGMLQuantizationType, n: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return -(-n // block) * size


def _pad(n: int, to: int = KV_PAD) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class MemoryOptions:
    """The load options that change memory; ``num_ctx`` is per slot, as in Ollama.

    ``flash_attention=None`` means llama.cpp's *auto*, which it resolves to enabled on the
    CPU and on GPUs that support it; a quantized V cache is honoured only when flash
    attention is explicitly on (the runner falls back to f16 otherwise; kv_cache.py has
    every rule).  ``kv_cache_type`` is both sides' type, unless ``kv_cache_type_k`` or
    ``kv_cache_type_v`` names one side's.
    """

    num_ctx: int
    num_parallel: int = 1
    num_batch: int = 512
    kv_cache_type: str = "f16"
    kv_cache_type_k: str = ""
    kv_cache_type_v: str = ""
    flash_attention: bool | None = False
    projector: int = 0  # a vision projector's bytes (:func:`projector_bytes`), 0 without one
    draft: int = 0  # a draft model's bytes (:func:`draft_bytes`), 0 without one


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """What memory prediction needs from a GGUF header, summed once per file."""

    architecture: str
    block_count: int
    train_ctx: int
    embd: int
    vocab: int
    merges: int
    ff: int  # largest feed-forward length over the layers
    heads: tuple[int, ...]  # per layer
    kv_heads: tuple[int, ...]  # per layer; 0 marks a recurrent (SSM) layer
    head_dim_k: int
    head_dim_v: int
    sliding_window: int  # 0: none
    swa_layers: tuple[bool, ...]  # per layer: uses the sliding window
    ssm_state: int  # recurrent state bytes per layer and sequence (f32)
    embedding_model: bool
    layer_weights: tuple[int, ...]  # bytes of blk.N.* per layer
    input_weights: int  # token_embd and every other tensor outside blocks and output
    output_weights: int  # what offloading the output layer puts on a GPU
    output_host_weights: int  # what the output layer adds on the CPU (0 for tied embeddings)

    @property
    def weights(self) -> int:
        return self.input_weights + sum(self.layer_weights) + self.output_host_weights


_profiles: weakref.WeakKeyDictionary[GGUFInfo, ModelProfile] = weakref.WeakKeyDictionary()


def profile(info: GGUFInfo) -> ModelProfile:
    """The :class:`ModelProfile` of ``info``, computed once per ``GGUFInfo`` object."""
    cached = _profiles.get(info)
    if cached is None:
        cached = _profiles[info] = _build_profile(info)
    return cached


def _per_layer(value: int | tuple[int, ...], n: int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * n
    return tuple(value[i] if i < len(value) else (value[-1] if value else 0) for i in range(n))


def _build_profile(info: GGUFInfo) -> ModelProfile:
    n_layers = info.block_count
    by_layer = info.layer_tensors()
    if by_layer:
        n_layers = max(n_layers, max(by_layer) + 1)
    layer_weights = tuple(sum(t.nbytes for t in by_layer.get(i, ())) for i in range(n_layers))

    heads = _per_layer(info.head_count, n_layers)
    kv_heads = _per_layer(info.head_count_kv, n_layers)
    embd = info.embedding_length
    # llama.cpp derives the head size from the first layer's head count.
    first_heads = next((h for h in heads if h > 0), 0)
    default_dim = embd // first_heads if first_heads else 0
    head_dim_k = info.key_length or default_dim
    head_dim_v = info.value_length or default_dim

    window = info.sliding_window or 0
    swa_layers = _swa_layers(info.architecture, info.sliding_window_pattern, window, n_layers)

    ff = info.feed_forward_length
    ff_max = ff if isinstance(ff, int) else max(ff, default=0)

    merges = info.metadata.get("tokenizer.ggml.merges")
    n_merges = len(merges) if isinstance(merges, (list, ArraySummary)) else 0

    output = info.tensor("output.weight")
    norm = info.tensor("output_norm.weight")
    embd_tensor = info.tensor("token_embd.weight")
    norm_bytes = norm.nbytes if norm is not None else 0
    if output is not None:
        output_weights = output_host = output.nbytes + norm_bytes
    else:  # tied: llama.cpp copies token_embd to the GPU, the CPU keeps its own
        output_weights = norm_bytes + (embd_tensor.nbytes if embd_tensor is not None else 0)
        output_host = norm_bytes
    non_layer = sum(t.nbytes for t in info.non_layer_tensors())

    return ModelProfile(
        architecture=info.architecture,
        block_count=n_layers,
        train_ctx=info.context_length,
        embd=embd,
        vocab=info.vocab_size,
        merges=n_merges,
        ff=ff_max,
        heads=heads,
        kv_heads=kv_heads,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        sliding_window=window if any(swa_layers) else 0,
        swa_layers=swa_layers,
        ssm_state=_ssm_state_bytes(info),
        embedding_model=info.pooling_type is not None,
        layer_weights=layer_weights,
        input_weights=non_layer - output_host,
        output_weights=output_weights,
        output_host_weights=output_host,
    )


def _swa_layers(
    arch: str, pattern: int | tuple[int, ...] | None, window: int, n_layers: int
) -> tuple[bool, ...]:
    if window <= 0:
        return (False,) * n_layers
    if isinstance(pattern, tuple):
        return tuple(bool(pattern[i]) if i < len(pattern) else False for i in range(n_layers))
    period = pattern if isinstance(pattern, int) else _SWA_PERIODS.get(arch, 0)
    if period <= 0:
        # Unknown layout: count every layer at full context (an overestimate, never under).
        return (False,) * n_layers
    # llama.cpp's set_swa_pattern(n): layer i slides unless i % n == n - 1.
    return tuple(i % period < period - 1 for i in range(n_layers))


def _ssm_state_bytes(info: GGUFInfo) -> int:
    """Recurrent state per layer and sequence, in f32 (spec/scheduler.md §3.2)."""
    inner = info.ssm_inner_size or 0
    state = info.ssm_state_size or 0
    if not inner:
        return 0
    conv = info.ssm_conv_kernel or 0
    groups = info.ssm_group_count or 0
    conv_term = (conv - 1) * (inner + 2 * groups * state) if conv > 0 else 0
    return 4 * (conv_term + state * inner)


@dataclass(frozen=True, slots=True)
class Estimate:
    """Predicted bytes of one load, before deciding where the layers go."""

    num_ctx: int  # per slot, after clamping to the training context
    num_parallel: int
    n_ubatch: int  # tokens per compute graph
    kv_cache_type_k: str  # as the runner will really use it
    kv_cache_type_v: str
    flash_attention: bool  # as llama.cpp will resolve it on the CPU
    layer_weights: tuple[int, ...]
    layer_kv: tuple[int, ...]
    input_weights: int  # stays on the CPU in llama.cpp
    output_weights: int  # on a GPU when the output layer is offloaded
    output_host_weights: int  # on the CPU when it is not
    cpu_compute: int  # CPU compute buffer while any layer runs on the CPU
    cpu_work: int  # the CPU threads' work buffer while any layer runs on the CPU
    cpu_compute_offloaded: int  # CPU compute buffer when every layer is on GPUs
    gpu_graph_full: int  # GPU compute graph when every layer is on GPUs (Ollama's formula)
    gpu_graph_partial: int  # GPU compute graph when some layers stay on the CPU
    output_buffer: int  # logits (and embeddings) buffer, on the CPU
    overhead: int  # runner process and llama.cpp's vocabulary
    projector: int = 0  # vision projector weights + image encoder graph, on the first device
    # A draft model for speculative decoding: its weights, KV cache and compute, on the
    # first device when the whole target fits beside it there, else on the CPU.
    draft: int = 0
    # llama.cpp's host-RAM prompt cache: slot states kept after they lost their slot.  It
    # grows on demand up to this limit, always on the CPU; it is not counted in ``total``:
    # placement books what the cache holds, as it grows (scheduler/prompt_cache.py).
    prompt_cache: int = 0

    @property
    def block_count(self) -> int:
        return len(self.layer_weights)

    @property
    def kv_cache_type(self) -> str:
        """Both sides' type, or ``K <type>, V <type>`` when they differ."""
        return str(KvCacheTypes(self.kv_cache_type_k, self.kv_cache_type_v))

    @property
    def weights(self) -> int:
        """All tensor bytes as loaded on the CPU (tied embeddings counted once)."""
        return self.input_weights + sum(self.layer_weights) + self.output_host_weights

    @property
    def kv(self) -> int:
        return sum(self.layer_kv)

    @property
    def layer_sizes(self) -> tuple[int, ...]:
        """Weights plus KV cache of each block: what offloading it moves to a GPU."""
        return tuple(w + k for w, k in zip(self.layer_weights, self.layer_kv, strict=True))

    @property
    def gpu_graph(self) -> int:
        """The graph reserve a GPU needs before knowing whether all layers fit."""
        return max(self.gpu_graph_full, self.gpu_graph_partial)

    @property
    def total(self) -> int:
        """Everything on the CPU: the resident memory of a CPU-only runner."""
        return (
            self.weights
            + self.kv
            + self.cpu_compute
            + self.cpu_work
            + self.output_buffer
            + self.overhead
            + self.projector
            + self.draft
        )


def estimate(model: GGUFInfo | ModelProfile, opts: MemoryOptions) -> Estimate:
    """Predict the memory of loading ``model`` with ``opts`` (see docs/memory.md)."""
    p = model if isinstance(model, ModelProfile) else profile(model)
    par = max(1, opts.num_parallel)
    ctx = max(1, opts.num_ctx)
    if p.train_ctx > 0:
        ctx = min(ctx, p.train_ctx)

    # The runner's batch rules (runner/options.py): n_batch = n_ubatch.
    batch = max(1, min(opts.num_batch, ctx))
    if p.embedding_model and batch < ctx:
        batch = max(batch, min(ctx, EMBEDDING_BATCH_CAP))
    ubatch = min(batch, ctx * par)

    wanted = requested_kv_types(
        [{"kv_cache_type_k": opts.kv_cache_type_k, "kv_cache_type_v": opts.kv_cache_type_v}],
        opts.kv_cache_type or "f16",
    )
    for name in (wanted.k, wanted.v):
        _kv_type(name)  # an unknown name is the caller's error here: ValueError
    kv, _ = usable_kv_types(
        wanted,
        flash_attention=opts.flash_attention is True,
        head_dim_k=p.head_dim_k,
        head_dim_v=p.head_dim_v,
    )
    k_type, v_type = _kv_type(kv.k), _kv_type(kv.v)
    flash = opts.flash_attention is not False  # auto resolves to enabled on the CPU

    cells = _pad(ctx)  # per sequence; llama.cpp keeps one stream per slot
    swa_cells = _pad(min(cells, p.sliding_window + ubatch)) if p.sliding_window else cells
    layer_kv = []
    for i in range(p.block_count):
        hkv = p.kv_heads[i]
        if hkv > 0 and p.heads[i] > 0:
            n = swa_cells if p.swa_layers[i] else cells
            row = _row_bytes(k_type, p.head_dim_k * hkv) + _row_bytes(v_type, p.head_dim_v * hkv)
            layer_kv.append(par * n * row)
        else:
            layer_kv.append(par * p.ssm_state)

    # CPU compute buffer: the largest set of f32 activations live at once in llama.cpp's
    # graph (the FFN or, without flash attention, the attention), the per-token inputs and
    # the KQ mask; fitted to llama.cpp's own numbers (docs/memory.md).
    e = p.embd
    max_heads = max(p.heads, default=0)
    embd_kv = max(p.head_dim_k, p.head_dim_v) * max(p.kv_heads, default=0)
    inputs = GRAPH_INPUT_BYTES * ubatch
    ffn_phase = 4 * ubatch * (3 * p.ff + 5 * e)
    if flash:
        cpu_compute = max(ffn_phase, 4 * ubatch * 8 * e) + inputs + 2 * ubatch * cells
    else:
        attn_phase = 4 * ubatch * (6 * e + 2 * embd_kv + max_heads * cells) + 4 * ubatch * cells
        cpu_compute = max(attn_phase, ffn_phase + 6 * ubatch * cells) + inputs
    # The CPU backend converts a matmul's activations to the weights' dot type (f16 at
    # worst) in a work buffer; without flash attention that includes KQ before KQ x V.
    cpu_work = 2 * ubatch * max(e, p.ff)
    if not flash:
        cpu_work = max(cpu_work, 2 * ubatch * max_heads * cells)

    full, partial = _ollama_llama_graph(p, ctx * par, opts.num_batch)
    outputs = 4 * par * (p.vocab + (e if p.embedding_model else 0))
    overhead = RUNNER_OVERHEAD + VOCAB_TOKEN_BYTES * p.vocab + VOCAB_MERGE_BYTES * p.merges
    return Estimate(
        num_ctx=ctx,
        num_parallel=par,
        n_ubatch=ubatch,
        kv_cache_type_k=kv.k,
        kv_cache_type_v=kv.v,
        flash_attention=flash,
        layer_weights=p.layer_weights,
        layer_kv=tuple(layer_kv),
        input_weights=p.input_weights,
        output_weights=p.output_weights,
        output_host_weights=p.output_host_weights,
        cpu_compute=cpu_compute,
        cpu_work=cpu_work,
        cpu_compute_offloaded=4 * ubatch * e,  # the input embeddings, gathered on the CPU
        gpu_graph_full=full,
        gpu_graph_partial=partial,
        output_buffer=outputs,
        overhead=overhead,
        projector=max(0, opts.projector),
        draft=max(0, opts.draft),
    )


def draft_bytes(draft: GGUFInfo | ModelProfile, opts: MemoryOptions) -> int:
    """A draft model's memory beside its target: llama.cpp gives it its own context of the
    target's size and slots, so it is its own estimate at the target's options, less the
    runner's fixed cost, which the target already pays.  (Predicted like a CPU load,
    also where it goes on a GPU; not calibrated against measured loads.)"""
    alone = estimate(draft, replace(opts, projector=0, draft=0))
    return alone.total - RUNNER_OVERHEAD


def projector_bytes(info: GGUFInfo) -> int:
    """A vision projector's memory once loaded: its weights plus the image encoder's compute
    graph for one image (f32 activations of one block over the patch grid, attention scores
    included).  Not calibrated against measured loads the way the text model is."""
    md = info.metadata
    image = int(md.get("clip.vision.image_size") or 0)
    patch = int(md.get("clip.vision.patch_size") or 0) or 1
    embd = int(md.get("clip.vision.embedding_length") or 0)
    ff = int(md.get("clip.vision.feed_forward_length") or 0)
    heads = int(md.get("clip.vision.attention.head_count") or 0)
    positions = (image // patch) ** 2 + 1  # the patches and the class embedding
    graph = 4 * positions * (6 * embd + 2 * ff) + 4 * heads * positions * positions
    return info.tensor_bytes + graph


def _ollama_llama_graph(p: ModelProfile, c: int, b: int) -> tuple[int, int]:
    """Ollama's ``GraphSize`` for llama (spec/scheduler.md §3.2): (full, partial) bytes."""
    e, v = p.embd, p.vocab
    h = max(p.heads, default=0)
    h_kv = max(p.kv_heads, default=0)
    min_heads = min((x for x in p.heads if x > 0), default=0)
    d = p.head_dim_k or (e // min_heads if min_heads else 0)
    full = max(4 * b * (1 + 4 * e + c * (1 + h)), 4 * b * (e + v))
    partial = 4 * b * e + max(
        4 * b * (1 + e + max(c, e)) + 9 * e * e // 16 + 4 * c * (b * h + d * h_kv),
        4 * b * (e + v) + 105 * e * v // 128,
    )
    return full, partial


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the layers go, and what that costs on each device.

    ``num_gpu_layers`` is llama.cpp's ``n_gpu_layers``: the last ``n`` layers, counting the
    output layer as one (``block_count + 1`` means everything).  ``gpu_layers`` lists only the
    GPUs that received layers, in the order they were given; load with exactly those GPUs and
    ``tensor_split`` (their layer counts, same order), which llama.cpp turns back into these
    counts (the first GPU takes the lowest layers, the last one the output layer).
    """

    gpu_layers: dict[str, int]  # GPUs that received layers -> block count (+1 with output)
    vram_by_gpu: dict[str, int]  # GPUs that received layers -> bytes, graph included
    host_bytes: int
    num_gpu_layers: int
    tensor_split: tuple[float, ...]
    fits_fully: bool  # every layer, output included, is on a GPU
    prompt_cache: int = 0  # the host prompt cache's limit (not in host_bytes: it starts empty)
    draft_on_gpu: bool = False  # the draft model (if any) is on the first GPU, not the CPU

    @property
    def vram(self) -> int:
        return sum(self.vram_by_gpu.values())

    @property
    def total(self) -> int:
        return self.host_bytes + self.vram

    @property
    def usage(self) -> MemoryUsage:
        return MemoryUsage(total=self.total, vram_by_gpu=dict(self.vram_by_gpu))


_BALANCE_STEPS: Final = 14  # binary-search steps of the capacity factor: 1/16384 precision


def plan_layout(
    estimate: Estimate,
    gpus: Sequence[tuple[str, int]],
    *,
    gpu_overhead: int = 0,
    num_gpu: int = -1,
    reserves: Mapping[str, int] | None = None,
    factors: Mapping[str, float] | None = None,
) -> Layout:
    """Offload as many layers as fit on ``gpus`` ((id, free bytes) pairs), from the last.

    Each GPU costs its ``reserves`` entry (the runner's GPU context) plus its layers and the
    graph, the latter two scaled by its ``factors`` entry (a correction learned from measured
    loads, 1.0 by default).  So it can hold ``(free - gpu_overhead - reserve) / factor - graph``
    bytes of layers.  The output layer is offloaded only together with every block.  Layers are
    spread over the GPUs in proportion to that capacity.  ``num_gpu >= 0`` caps the layer count
    (0: CPU only).

    A draft model (``estimate.draft``) goes on the first GPU, like the projector, when the
    whole model still fits beside it; otherwise it stays on the CPU and leaves the GPUs to
    the model's layers.
    """
    if estimate.draft and gpus and num_gpu != 0:
        beside = _layout(estimate, gpus, gpu_overhead, num_gpu, reserves, factors, True)
        if beside.fits_fully:
            return beside
    return _layout(estimate, gpus, gpu_overhead, num_gpu, reserves, factors, False)


def _layout(
    estimate: Estimate,
    gpus: Sequence[tuple[str, int]],
    gpu_overhead: int,
    num_gpu: int,
    reserves: Mapping[str, int] | None,
    factors: Mapping[str, float] | None,
    draft_on_gpu: bool,
) -> Layout:
    reserves = reserves or {}
    factors = factors or {}
    n_blocks = estimate.block_count
    limit = n_blocks + 1 if num_gpu < 0 else min(num_gpu, n_blocks + 1)
    # What the runner's first GPU holds besides layers and graph (mtmd's and the draft's
    # default device).
    first_extra = estimate.projector + (estimate.draft if draft_on_gpu else 0)
    capacity = [
        max(
            0,
            int((free - gpu_overhead - reserves.get(gpu_id, 0)) / factors.get(gpu_id, 1.0))
            - estimate.gpu_graph
            - (first_extra if index == 0 else 0),
        )
        for index, (gpu_id, free) in enumerate(gpus)
    ]
    sizes = estimate.layer_sizes[::-1]  # top-down: llama.cpp offloads the last layers

    counts: list[int] = [0] * len(gpus)
    placed = 0
    if limit > 0 and any(capacity):
        if limit == n_blocks + 1:
            counts = _fill((estimate.output_weights, *sizes), capacity)
            placed = sum(counts)
        if placed < n_blocks + 1:
            counts = _fill(sizes[: min(limit, n_blocks)], capacity)
            placed = sum(counts)
        if placed and len(gpus) > 1:
            seq = (estimate.output_weights, *sizes) if placed > n_blocks else sizes[:placed]
            counts = _balance(seq, capacity)

    full = placed == n_blocks + 1
    gpu_layers: dict[str, int] = {}
    vram: dict[str, int] = {}
    seq = (estimate.output_weights, *sizes) if full else sizes
    graph = estimate.gpu_graph_full if full else estimate.gpu_graph_partial
    start = 0
    first = next((i for i, count in enumerate(counts) if count), None)
    for index in range(len(gpus) - 1, -1, -1):  # the last GPU holds the top layers
        count = counts[index]
        if count:
            gpu_id = gpus[index][0]
            gpu_layers[gpu_id] = count
            model_part = (sum(seq[start : start + count]) + graph) * factors.get(gpu_id, 1.0)
            vram[gpu_id] = int(model_part) + reserves.get(gpu_id, 0)
            if index == first:
                vram[gpu_id] += first_extra
            start += count

    cpu_blocks = n_blocks - min(placed, n_blocks)
    host = (
        estimate.input_weights
        + sum(estimate.layer_weights[:cpu_blocks])
        + sum(estimate.layer_kv[:cpu_blocks])
        + (0 if full else estimate.output_host_weights)
        + (estimate.cpu_compute_offloaded if full else estimate.cpu_compute + estimate.cpu_work)
        + estimate.output_buffer
        + estimate.overhead
        + (estimate.projector if first is None else 0)
        + (0 if draft_on_gpu else estimate.draft)
    )
    return Layout(
        gpu_layers=dict(reversed(gpu_layers.items())),
        vram_by_gpu=dict(reversed(vram.items())),
        host_bytes=host,
        num_gpu_layers=placed,
        tensor_split=tuple(float(c) for c in counts if c),
        fits_fully=full,
        prompt_cache=estimate.prompt_cache,
        draft_on_gpu=draft_on_gpu and first is not None,
    )


def _fill(sizes: Sequence[int], capacity: Sequence[float]) -> list[int]:
    """Greedy: fill the last GPU with layers from the top, then the one before, and so on."""
    counts = [0] * len(capacity)
    index = len(capacity) - 1
    used = 0.0
    for size in sizes:
        while index >= 0 and used + size > capacity[index]:
            index -= 1
            used = 0.0
        if index < 0:
            break
        counts[index] += 1
        used += size
    return counts


def _balance(sizes: Sequence[int], capacity: Sequence[int]) -> list[int]:
    """Spread ``sizes`` (all of which fit) over the GPUs in proportion to their capacity.

    The smallest factor ``f`` for which filling each GPU up to ``f × capacity`` still places
    every layer gives each GPU its share (a simpler form of Ollama's ``findBestFit``).
    """
    low, high = 0.0, 1.0
    best = _fill(sizes, capacity)
    for _ in range(_BALANCE_STEPS):
        mid = (low + high) / 2
        counts = _fill(sizes, [mid * c for c in capacity])
        if sum(counts) == len(sizes):
            best, high = counts, mid
        else:
            low = mid
    return best
