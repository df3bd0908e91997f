"""KV cache types, per side: which names exist, what the settings' layers ask for, and what
llama.cpp will really accept for one model.

One rule serves the runner (which loads with it) and memory prediction (which books what
the runner will use), so the two never disagree.  A leaf: it imports nothing of the
project.  docs/memory.md and docs/scheduling.md say where each side's type comes from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

#: llama.cpp's accepted KV cache types (common/arg.cpp ``kv_cache_types``), each with its
#: block size in elements and the bytes of one block (ggml's type traits).
KV_CACHE_TYPES: Final[Mapping[str, tuple[int, int]]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}
UNQUANTIZED: Final = frozenset({"f32", "f16", "bf16"})
DEFAULT: Final = "f16"
#: The option and setting names, for a model's config file, its Modelfile and a request.
KEYS: Final = ("kv_cache_type", "kv_cache_type_k", "kv_cache_type_v")


def kv_type_name(value: str) -> str:
    """``value`` as a known type name (any case).

    Raises:
        ValueError: not one of :data:`KV_CACHE_TYPES`, naming them.
    """
    name = value.strip().lower()
    if name not in KV_CACHE_TYPES:
        raise ValueError(
            f"unknown KV cache type {value!r}; choose from {', '.join(KV_CACHE_TYPES)}"
        )
    return name


@dataclass(frozen=True)
class KvCacheTypes:
    """The K and V caches' types."""

    k: str = DEFAULT
    v: str = DEFAULT

    def __str__(self) -> str:
        return self.k if self.k == self.v else f"K {self.k}, V {self.v}"


def requested_kv_types(layers: Iterable[Mapping[str, object]], default: str) -> KvCacheTypes:
    """Each side's type from ``layers`` (first wins: a request's options, then the model's
    configured settings) holding :data:`KEYS`: a layer's ``kv_cache_type_k`` or ``_v``
    before its ``kv_cache_type``; a side no layer sets takes ``default`` (the server's)."""
    sides: dict[str, str] = {}
    for layer in layers:
        both = layer.get("kv_cache_type")
        for side in ("k", "v"):
            value = layer.get(f"kv_cache_type_{side}") or both
            if side not in sides and isinstance(value, str) and value:
                sides[side] = value.lower()
    return KvCacheTypes(sides.get("k", default.lower()), sides.get("v", default.lower()))


def usable_kv_types(
    wanted: KvCacheTypes, *, flash_attention: bool, head_dim_k: int = 0, head_dim_v: int = 0
) -> tuple[KvCacheTypes, str | None]:
    """The types llama.cpp will load ``wanted`` with for one model, and a warning naming
    each side that fell back to f16 (None when none did):

    - an unknown type;
    - a quantized V cache without flash attention (explicitly on: llama.cpp refuses one
      otherwise, and *auto* may resolve to off on a GPU);
    - a quantized type whose block does not divide that side's head size (llama.cpp
      refuses the load).

    A quantized K cache needs no flash attention."""
    used: dict[str, str] = {}
    reasons: list[str] = []
    for side, name, head_dim in (("K", wanted.k, head_dim_k), ("V", wanted.v, head_dim_v)):
        block = KV_CACHE_TYPES.get(name, (0, 0))[0]
        if not block:
            reasons.append(f"{side} cache type {name!r} is unknown")
        elif side == "V" and name not in UNQUANTIZED and not flash_attention:
            reasons.append(f"a quantized V cache ({name}) needs flash attention")
        elif head_dim > 0 and head_dim % block:
            reasons.append(f"{side} cache type {name} does not divide the head size {head_dim}")
        else:
            used[side] = name
            continue
        used[side] = DEFAULT
    result = KvCacheTypes(used["K"], used["V"])
    if not reasons:
        return result, None
    return result, f"kv cache type {wanted} unusable: {'; '.join(reasons)}; using {result}"
