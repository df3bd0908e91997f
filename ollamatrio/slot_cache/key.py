"""Which saved states a runner may restore: the cache key.

A slot state is the KV cache of one sequence, so it is only valid for the same weights
(model file, LoRA adapters, projector) and the same KV layout and numerics: context per
slot, KV cache type, flash attention (it changes the V cache's layout), batch sizes,
offloaded layers, embedding and pooling.  Every one of these goes into the key, taken from
the plan the runner really loaded with (its ready line), not from what was asked; a state
saved under one key is never offered under another.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from ..types import LoadSpec

# The plan fields (runner/options.py LoadPlan, as the ready line reports them) that shape
# the KV cache or the numbers in it.
PLAN_FIELDS = (
    "n_batch",
    "n_ubatch",
    "flash_attention",
    "kv_cache_type_k",
    "kv_cache_type_v",
    "n_gpu_layers",
    "embedding",
    "pooling",
)


def cache_key(spec: LoadSpec, plan: Mapping[str, Any], context_length: int) -> str:
    """The key of the states a runner loaded with ``spec`` and ``plan`` may share."""
    parts: dict[str, Any] = {
        # Store blobs are named by their digest, so the file name is the model's identity.
        "model": os.path.basename(spec.model_path),
        "adapters": [os.path.basename(a) for a in spec.adapters],
        "projector": os.path.basename(spec.projector) if spec.projector else None,
        "ctx_per_slot": context_length,
        **{name: plan.get(name) for name in PLAN_FIELDS},
    }
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
