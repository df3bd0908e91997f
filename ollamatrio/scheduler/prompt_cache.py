"""How much host RAM a runner's prompt cache may take (pure; docs/prompt_cache.md).

llama.cpp keeps the state of a slot that is given to another prompt in a host-RAM cache
(``cache_ram_mib``) and restores it when a prompt that shares its prefix comes back, so a
conversation that lost its slot to another one does not re-evaluate its whole prompt.  The
cache grows on demand up to its limit.  Placement books what it holds, not its limit, and
:func:`grants` shares the host memory nobody booked among the caches, so that together they
never grow past it: a model placed later takes that room, and the caches' grants shrink.

The limit, in this order: the model's ``prompt_cache`` in the config file, then
``OLLAMATRIO_PROMPT_CACHE``, then :data:`STATES` full slot states (the KV cache of one slot
at the load's context) but never more than :data:`FREE_RAM_SHARE` of the free RAM.  A cached
state costs the KV bytes of its tokens, so :data:`STATES` full conversations fit, and short
side requests (titles) take a few percent of one each.  Embedding models get none: they
keep no prompt between requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

MiB: Final = 1 << 20
STATES: Final = 8  # full-context slot states the automatic limit holds
FREE_RAM_SHARE: Final = 0.25  # the automatic limit never takes more of the free RAM


def prompt_cache_bytes(
    *,
    model_mib: int | None,
    server_mib: int,
    kv_per_slot: int,
    free_ram: int,
    embedding: bool,
) -> int:
    """The cache limit in bytes, a whole number of MiB (what llama.cpp takes).

    ``model_mib``: the model's config setting (None: not set); ``server_mib``:
    ``OLLAMATRIO_PROMPT_CACHE`` (negative: not set); ``kv_per_slot``: the predicted KV cache
    bytes of one slot; ``free_ram``: the host's free memory in bytes.
    """
    if embedding:
        return 0
    if model_mib is not None:
        return model_mib * MiB
    if server_mib >= 0:
        return server_mib * MiB
    auto = min(STATES * kv_per_slot, int(max(0, free_ram) * FREE_RAM_SHARE))
    return auto // MiB * MiB


def grants(caches: Sequence[tuple[int, int]], spare: int) -> list[int]:
    """What each cache may hold from now on, for ``caches`` given as (limit, held) bytes and
    ``spare`` bytes of host memory that no model and no cache has booked.

    Each keeps what it holds and may grow by a share of ``spare``, never past its limit;
    the share of one that needs less goes to the others (the smallest needs are served
    first).  So the caches' growth together never exceeds ``spare``.  A cache may hold more
    than its grant (the grant then shrinks it); its held bytes are already booked.
    """
    spare = max(0, spare)
    result = [0] * len(caches)
    order = sorted(range(len(caches)), key=lambda i: caches[i][0] - caches[i][1])
    for left, index in enumerate(order):
        limit, held = caches[index]
        growth = min(max(0, limit - held), spare // (len(order) - left))
        spare -= growth
        result[index] = min(limit, held + growth)
    return result
