"""Turn a :class:`LoadPlan` into xllamacpp ``CommonParams`` (the only module importing it)."""

from __future__ import annotations

import xllamacpp as xlc

from ollamatrio.runner.folders import SOCKET_NAME
from ollamatrio.runner.options import LoadPlan, RunnerConfig

_FLASH = {
    "auto": xlc.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": xlc.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": xlc.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
_TENSOR_SPLIT_LEN = 128  # llama.cpp's fixed-size array


def socket_path(config: RunnerConfig) -> str:
    # llama.cpp binds a Unix socket only for hostnames ending in ".sock".
    return f"{config.socket_dir}/{SOCKET_NAME}"


def prompt_similarity(n_parallel: int) -> float:
    """llama.cpp's ``slot_prompt_similarity`` for this many slots.

    A slot chosen by prompt similarity keeps what it holds and saves nothing to the prompt
    cache unless more than half of it is lost; one chosen as least recently used saves its
    state and loads the cached state that best matches the new prompt.  With several slots,
    similarity sends a conversation back to the slot that holds its prefix (0.1, llama.cpp's
    default).  With one slot there is no choice to make, and similarity only does harm: a
    conversation that shares a long prefix with the one in the slot (agents' system prompts
    and tools) takes the slot without the other's history being saved, and the other's next
    turn evaluates that history again.  0 disables it, so every switch goes through the
    cache (measured in docs/prompt_cache.md: turns evaluated 1.5 % -> 0.5 % of their prompt,
    TTFT 0.75 -> 0.46 s, four agent-shaped conversations taking turns on one slot)."""
    return 0.0 if n_parallel <= 1 else 0.1


def build_params(config: RunnerConfig, plan: LoadPlan) -> xlc.CommonParams:
    spec = config.spec
    p = xlc.CommonParams()
    p.model.path = spec.model_path
    p.ctx_shift = spec.context_shift
    p.model_alias = {spec.name}  # a set: a str would become a set of characters
    p.hostnames = [socket_path(config)]
    p.api_keys = [config.api_key]
    p.endpoint_metrics = True
    p.endpoint_slots = True
    p.verbosity = config.verbosity
    # The host prompt cache, sized by the scheduler (llama.cpp's default of 8 GiB would skew
    # the accounting); see docs/prompt_cache.md for how it keeps and evicts slot states.
    p.cache_ram_mib = spec.prompt_cache_mib
    p.cache_idle_slots = True  # idle slots' states are copied to the cache as tasks start
    p.slot_prompt_similarity = prompt_similarity(plan.n_parallel)
    if config.slot_save_dir:
        # llama.cpp joins this and the file name without a separator of its own.
        p.slot_save_path = config.slot_save_dir.rstrip("/") + "/"
    p.fit_params = False  # the scheduler decides sizes; no dry-run load
    # No empty decode at load (Ollama's runner does none either): it only pre-touches weights
    # the first prompt reads anyway, and on a busy CPU it doubled Server()'s time (median
    # 1.46 s with it, 0.75 s without, five interleaved pairs; docs/benchmarks.md).
    p.warmup = False

    p.n_ctx = plan.n_ctx
    p.n_parallel = plan.n_parallel
    p.n_batch = plan.n_batch
    p.n_ubatch = plan.n_ubatch
    threads = spec.num_thread or spec.cores
    if threads > 0:
        p.cpuparams.n_threads = threads
        p.cpuparams_batch.n_threads = threads
    p.flash_attn_type = _FLASH[plan.flash_attention]
    p.cache_type_k = xlc.ggml_type[f"GGML_TYPE_{plan.kv_cache_type_k.upper()}"]
    p.cache_type_v = xlc.ggml_type[f"GGML_TYPE_{plan.kv_cache_type_v.upper()}"]
    p.load_mode = (
        xlc.llama_load_mode.LLAMA_LOAD_MODE_MMAP
        if plan.use_mmap
        else xlc.llama_load_mode.LLAMA_LOAD_MODE_NONE
    )

    p.n_gpu_layers = plan.n_gpu_layers
    if spec.main_gpu is not None:
        p.main_gpu = spec.main_gpu
        p.split_mode = xlc.llama_split_mode.LLAMA_SPLIT_MODE_NONE
    if spec.tensor_split:
        split = list(spec.tensor_split)[:_TENSOR_SPLIT_LEN]
        p.tensor_split = split + [0.0] * (_TENSOR_SPLIT_LEN - len(split))

    if plan.embedding:
        p.embedding = True
    if plan.pooling is not None:
        p.pooling_type = xlc.llama_pooling_type[f"LLAMA_POOLING_TYPE_{plan.pooling.upper()}"]
    if spec.adapters:
        p.lora_adapters = [xlc.CommonAdapterLoraInfo(path, 1.0) for path in spec.adapters]
    if spec.projector:
        p.mmproj.path = spec.projector
        # mtmd puts the projector on the first GPU unless told not to: a CPU-only load keeps
        # it on the CPU, where the memory prediction counts it.
        p.mmproj_use_gpu = plan.n_gpu_layers != 0
    if spec.chat_template:
        p.chat_template = spec.chat_template
    if spec.speculative == "ngram" and not plan.embedding:
        configure_ngram(p.speculative)
    if spec.draft_num_predict > 0 and (spec.draft_model or spec.mtp):
        draft_by_model(p, config, threads)
    return p


# N-gram drafting (docs/speculative.md has the measurements behind these choices): llama.cpp's
# ngram-simple drafts what followed the latest earlier place of the last 12 tokens in the
# slot's context, up to 48 tokens (a line or two of a re-emitted file or a quoted diff).  A
# 12-token key rarely matches by chance in prose, where it drafts nothing (nothing to verify,
# nothing lost); after a rejected draft the key holds the model's own token, so drafting
# resumes only once 12 tokens match the context again.  Not the map drafters (map-k,
# map-k4v): after a context shift they abort the runner (GGML_ASSERT in ngram-map.cpp).
NGRAM_TYPE = xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE
NGRAM_KEY = 12  # tokens that must match an earlier place in the context
NGRAM_DRAFT = 48  # tokens drafted after the match, at most


def configure_ngram(spec: xlc.CommonParamsSpeculative) -> None:
    """llama.cpp's n-gram drafter: where the last tokens match an earlier place in the
    slot's context, it drafts the tokens that followed them there."""
    spec.types = [NGRAM_TYPE]
    spec.ngram_simple.size_n = NGRAM_KEY
    spec.ngram_simple.size_m = NGRAM_DRAFT


def draft_by_model(p: xlc.CommonParams, config: RunnerConfig, threads: int) -> None:
    """Speculative decoding by a draft model loaded in this process, or by the model's own
    multi-token-prediction heads: added to whatever other drafters are configured."""
    spec = config.spec
    speculative = p.speculative
    draft = speculative.draft
    if spec.draft_model:
        kind = xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE
        draft.mparams.path = spec.draft_model
        draft.n_gpu_layers = spec.draft_gpu_layers
    else:
        kind = xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_MTP
        p.load_mtp = True
    draft.n_max = spec.draft_num_predict
    if threads > 0:
        draft.cpuparams.n_threads = threads
        draft.cpuparams_batch.n_threads = threads
    none = xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_NONE
    speculative.types = [t for t in speculative.types if t != none] + [kind]
