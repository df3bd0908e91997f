"""Which host of a fleet serves a request for a model: the routing policy, pure.

Loading a model costs seconds to minutes and memory that other models could use, so the
policy's first aim is that a model lives on as few hosts as its traffic needs:

1. **warm**: hosts with the model loaded and room for one more request (the least busy
   first);
2. **loading**: hosts loading it, or to which a request for it was just sent (the gateway's
   own memory, before the host's events say so);
3. **cold** (or **spill**, when every host holding the model is saturated): the other hosts
   in rendezvous-hash order of (model, host), those whose free memory fits the model's
   predicted size first, then those that would have to evict something to fit it;
4. **saturated** hosts last, holders first: a request there waits in the host's queue.

So a second copy of a model is loaded only when every host holding it is saturated, and a
cold model goes where its hash says, which is the same host in every gateway process (the
hash is BLAKE2b, never Python's randomised ``hash()``) and moves only when that host leaves
(rendezvous hashing: removing a host changes no other host's rank).

Each host's rank depends on that host alone, never on the others, so the order over a set of
hosts is the order over any larger set with the extra hosts left out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

RouteKind = Literal["warm", "loading", "cold", "spill", "saturated"]

_TIERS: dict[RouteKind, int] = {"warm": 0, "loading": 1, "cold": 2, "spill": 2, "saturated": 4}
_NO_ROOM = 3  # cold or spill hosts whose free memory does not fit the model: after those that do


@dataclass(frozen=True)
class HostView:
    """What the router knows of one host at one moment."""

    host: str  # the host's stable identity (its address, or its replica's id)
    loaded: frozenset[str] = frozenset()  # models ready to serve
    loading: frozenset[str] = frozenset()  # models being loaded
    # Models that take no more requests without waiting: every slot busy, as many waiting.
    busy: frozenset[str] = frozenset()
    # Bytes free per device (GPUs and host RAM); None while the host has not said.
    free_memory: tuple[int, ...] | None = None
    saturated: bool = False  # the host as a whole takes nothing more (its queue is full)
    load: int = 0  # requests it is serving or holding, for ordering warm hosts

    def saturated_for(self, model: str) -> bool:
        return self.saturated or model in self.busy

    def fits(self, size: int | None) -> bool:
        """Whether ``size`` bytes fit the host's free memory (unknown sizes fit)."""
        if size is None or self.free_memory is None:
            return True
        return sum(self.free_memory) >= size


@dataclass(frozen=True)
class Choice:
    host: str
    kind: RouteKind


def rendezvous_score(model: str, host: str) -> int:
    """The host's weight for the model: the same in every process and on every machine."""
    digest = hashlib.blake2b(f"{model}\0{host}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def route(
    model: str,
    hosts: Iterable[HostView],
    *,
    size: int | None = None,
    recent: Mapping[str, str] | None = None,
) -> list[Choice]:
    """Every host, in the order to try them for a request for ``model``.

    ``size`` is the model's predicted memory (None: unknown, it fits anywhere); ``recent``
    maps a model to the host it was just sent to cold, which then counts as loading it.
    """
    views = list(hosts)
    just_sent = (recent or {}).get(model)

    def holds(view: HostView) -> bool:
        return model in view.loaded or model in view.loading or view.host == just_sent

    # A cold host is a spill when every host holding the model is saturated (a second copy
    # because of load); with an unsaturated holder it is only a fallback.
    holders = [v for v in views if holds(v)]
    spill = bool(holders) and all(v.saturated_for(model) for v in holders)
    ranked = []
    for view in views:
        kind = _kind(model, view, holds(view), spill)
        tier = _TIERS[kind]
        if kind in ("cold", "spill") and not view.fits(size):
            tier = _NO_ROOM
        load = view.load if kind == "warm" else 0
        holder = 0 if holds(view) else 1  # among saturated hosts, holders first
        key = (tier, holder, load, -rendezvous_score(model, view.host), view.host)
        ranked.append((key, Choice(view.host, kind)))
    ranked.sort(key=lambda pair: pair[0])
    return [choice for _, choice in ranked]


def _kind(model: str, view: HostView, holds: bool, spill: bool) -> RouteKind:
    if view.saturated_for(model):
        return "saturated"
    if model in view.loaded:
        return "warm"
    if holds:
        return "loading"
    return "spill" if spill else "cold"
