"""Load-time options: what a request asks of a runner, and when a loaded runner won't do.

Only load-time options matter here (Ollama B26: num_ctx, num_batch, num_gpu, main_gpu,
use_mmap, num_thread, draft_num_predict; ours: speculative, the KV cache's types); sampling
options never cause a reload.  Whether the runner computes embeddings is a load-time choice
too (llama.cpp's ``embedding`` flag): a
runner loaded with it also generates, so it serves every request for its model file.

Bn codes in this module name Ollama's behaviours, each defined in docs/behaviours.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import speculative
from ..errors import InvalidRequestError
from ..kv_cache import DEFAULT as DEFAULT_KV_TYPE
from ..kv_cache import KEYS as KV_KEYS
from ..kv_cache import KvCacheTypes, requested_kv_types

GiB = 1 << 30

# Architectures whose llama.cpp implementation serves one sequence at a time (B13).
SINGLE_SLOT_ARCHITECTURES = frozenset(
    {
        "mllama", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen3next", "lfm2",
        "lfm2moe", "nemotron_h", "nemotron_h_moe", "nemotron_h_omni",
    }
)  # fmt: skip


@dataclass(frozen=True)
class LoadOptions:
    num_ctx: int  # per slot, clamped to the training context
    num_ctx_auto: bool
    num_batch: int
    num_batch_auto: bool
    num_gpu: int  # layers to offload; -1 = as many as fit
    main_gpu: int | None
    use_mmap: bool | None  # None = decided at load (auto)
    num_thread: int
    num_parallel: int
    context_shift: bool = True  # B27: the request's shift, else on (off for deepseek2)
    embeddings: bool = False  # loaded in embedding mode: it embeds, and generates too
    # The most tokens a draft model or the model's MTP heads propose per step; 0: no such
    # drafter is loaded (none in the model, or the ``speculative`` option rules it out).
    draft_num_predict: int = 0
    # As asked (a request's options, the model's config, the server's); the runner may
    # still fall back to f16 for a side this model cannot use (kv_cache.py).
    kv_cache_types: KvCacheTypes = field(default_factory=KvCacheTypes)
    drafter: speculative.Drafter = "none"  # speculative decoding's drafter (speculative.py)


def _int_option(options: Mapping[str, Any], key: str) -> int | None:
    value = options.get(key)
    if value is None:
        return None
    # JSON numbers arrive as int or float; bool is an int subclass but never a valid count.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"option {key} must be of type integer")
    if isinstance(value, float) and not value.is_integer():
        raise InvalidRequestError(f"option {key} must be of type integer")
    return int(value)


def _bool_option(options: Mapping[str, Any], key: str) -> bool | None:
    value = options.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise InvalidRequestError(f"option {key} must be of type boolean")
    return value


#: Ollama's default ``draft_num_predict`` for a model with a drafter (``api.DefaultOptions``).
DEFAULT_DRAFT_NUM_PREDICT = 4


def draft_num_predict(
    options: Mapping[str, Any], *, has_drafter: bool, configured: int | None = None
) -> int:
    """Ollama's rule: ``draft_num_predict`` (request, model parameter, else ``configured``,
    the model's TOML value, else 4) where the runner drafts by a model (a draft model or
    MTP heads, as the ``speculative`` option chose), else 0."""
    requested = _int_option(options, "draft_num_predict")
    if not has_drafter:
        return 0
    if requested is None:
        requested = configured if configured is not None else DEFAULT_DRAFT_NUM_PREDICT
    return max(0, requested)


def default_context_length(configured: int, total_vram: int, gpu_overhead: int = 0) -> int:
    """B15: OLLAMA_CONTEXT_LENGTH, else a tier chosen by the GPUs' total memory."""
    if configured > 0:
        return configured
    usable = max(0, total_vram - gpu_overhead)
    if usable >= 47 * GiB:
        return 262144
    if usable >= 23 * GiB:
        return 32768
    return 4096


def resolve_load_options(
    options: Mapping[str, Any],
    *,
    default_num_ctx: int,
    context_length_configured: bool,
    train_ctx: int,
    num_parallel: int,
    embedding_only: bool,
    embeddings: bool = False,
    architecture: str = "",
    has_projector: bool = False,
    shift: bool | None = None,
    has_draft_model: bool = False,
    configured_draft_num_predict: int | None = None,
    kv_cache_types: KvCacheTypes | None = None,
    speculative_default: str | None = None,
) -> LoadOptions:
    """Turn merged request options into what the runner is loaded with (B1, B13, B14, B16, B37).

    ``embedding_only``: the model cannot generate (one slot, B13); ``embeddings``: the
    request needs embeddings, so the runner is loaded in embedding mode (always so for an
    embedding-only model); ``has_draft_model``: the model has a draft model or MTP heads;
    ``kv_cache_types``: the model's configured (else the server's) KV cache types, which the
    options' ``kv_cache_type``, ``_k`` and ``_v`` override; ``speculative_default``: the
    model's configured ``speculative`` (the TOML model config), which the options' own
    value overrides."""
    embeddings = embeddings or embedding_only
    requested_ctx = _int_option(options, "num_ctx")
    num_ctx_auto = requested_ctx is None and not context_length_configured
    num_ctx = requested_ctx if requested_ctx is not None and requested_ctx > 0 else default_num_ctx
    num_ctx = max(num_ctx, 2048 if has_projector else 4)
    if train_ctx > 0:
        num_ctx = min(num_ctx, train_ctx)

    slots = max(1, num_parallel)
    if embedding_only or architecture in SINGLE_SLOT_ARCHITECTURES:
        slots = 1

    requested_batch = _int_option(options, "num_batch")
    if requested_batch is not None and requested_batch > 0:
        num_batch, batch_auto = requested_batch, False
    elif embeddings:
        # An embedding input must fit in one batch (llama.cpp pools per ubatch).  Still the
        # server's choice (automatic), so generation requests share this runner.
        num_batch, batch_auto = min(2048, num_ctx), True
    else:
        num_batch, batch_auto = 512, True
    num_batch = min(num_batch, num_ctx * slots)

    num_gpu = _int_option(options, "num_gpu")
    num_thread = _int_option(options, "num_thread")
    configured = kv_cache_types or KvCacheTypes()
    kv_types = requested_kv_types(
        [{key: options.get(key) for key in KV_KEYS}, {"kv_cache_type_k": configured.k,
                                                      "kv_cache_type_v": configured.v}],
        DEFAULT_KV_TYPE,
    )  # fmt: skip
    drafter = _drafter(
        options.get(speculative.OPTION, speculative_default), has_draft_model, embeddings
    )
    drafted = draft_num_predict(
        options, has_drafter=drafter == "draft", configured=configured_draft_num_predict
    )
    if drafter == "draft" and drafted == 0:
        drafter = "none"  # draft_num_predict 0 turns the draft model off
    return LoadOptions(
        num_ctx=num_ctx,
        num_ctx_auto=num_ctx_auto,
        num_batch=num_batch,
        num_batch_auto=batch_auto,
        num_gpu=-1 if num_gpu is None or num_gpu < 0 else num_gpu,
        main_gpu=_int_option(options, "main_gpu"),
        use_mmap=_bool_option(options, "use_mmap"),
        num_thread=max(0, num_thread or 0),
        num_parallel=slots,
        context_shift=shift if shift is not None else architecture != "deepseek2",
        embeddings=embeddings,
        draft_num_predict=drafted,
        kv_cache_types=kv_types,
        drafter=drafter,
    )


def _drafter(value: Any, has_draft_model: bool, embeddings: bool) -> speculative.Drafter:
    """The drafter the ``speculative`` option asks for.  A runner in embedding mode drafts
    nothing: llama.cpp gives it one output per batch, so a draft could not be verified."""
    try:
        mode = speculative.DEFAULT if value is None else speculative.parse_mode(value)
        drafter = speculative.drafter_for(mode, has_draft_model=has_draft_model)
    except speculative.SpeculativeError as exc:
        raise InvalidRequestError(str(exc)) from None
    return "none" if embeddings else drafter


def needs_reload(loaded: LoadOptions, wanted: LoadOptions) -> bool:
    """B25/B26 as Ollama decides: any load-time option that differs reloads, a smaller
    context included (a runner with other options never silently serves a request).
    Normalised first: a negative ``num_gpu`` asks for no particular count; an automatic
    ``num_ctx`` or ``num_batch`` on both sides is not compared.  Beyond Ollama's list: the
    parallel slot count, and embedding mode (a runner without it cannot embed; one with it
    serves generation as well, so it never reloads for that)."""
    if wanted.num_gpu >= 0 and wanted.num_gpu != loaded.num_gpu:
        return True
    if not (loaded.num_ctx_auto and wanted.num_ctx_auto) and wanted.num_ctx != loaded.num_ctx:
        return True
    both_auto_batch = loaded.num_batch_auto and wanted.num_batch_auto
    if not both_auto_batch and wanted.num_batch != loaded.num_batch:
        return True
    if wanted.main_gpu != loaded.main_gpu:  # unset places differently from 0 (placement.py)
        return True
    if wanted.use_mmap != loaded.use_mmap:
        return True
    if wanted.num_thread != loaded.num_thread:
        return True
    if wanted.context_shift != loaded.context_shift:
        return True  # B25: a load-time choice of llama.cpp's
    if wanted.embeddings and not loaded.embeddings:
        return True
    if wanted.draft_num_predict != loaded.draft_num_predict:
        return True  # B26: llama.cpp's --spec-draft-n-max is set at load
    if wanted.kv_cache_types != loaded.kv_cache_types:
        return True
    if wanted.drafter != loaded.drafter and not (wanted.embeddings or loaded.embeddings):
        # llama.cpp takes its drafter at load only.  A runner in embedding mode drafts
        # nothing and still serves generation (no reload back and forth between the two).
        return True
    return wanted.num_parallel != loaded.num_parallel
