"""The fleet's routing policy (ollamatrio/fleet/routing.py): tables and properties."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from ollamatrio.fleet.routing import Choice, HostView, rendezvous_score, route

MODELS = ["a", "b", "c"]
NAMES = [f"10.0.0.{i}:11434" for i in range(6)]
SETTINGS = settings(max_examples=200, deadline=None)


def models() -> st.SearchStrategy[frozenset[str]]:
    return st.frozensets(st.sampled_from(MODELS))


@st.composite
def views(draw: st.DrawFn) -> list[HostView]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True))
    return [
        HostView(
            host=name,
            loaded=draw(models()),
            loading=draw(models()),
            busy=draw(models()),
            free_memory=draw(st.none() | st.lists(st.integers(0, 8 << 30), max_size=3).map(tuple)),
            saturated=draw(st.booleans()),
            load=draw(st.integers(0, 4)),
        )
        for name in names
    ]


sizes = st.none() | st.integers(0, 16 << 30)
recents = st.dictionaries(st.sampled_from(MODELS), st.sampled_from(NAMES), max_size=2)


def test_order_of_the_tiers() -> None:
    hosts = [
        HostView("full", loaded=frozenset({"a"}), saturated=True),
        HostView("cold-small", free_memory=(1 << 30,)),
        HostView("cold"),
        HostView("loading", loading=frozenset({"a"})),
        HostView("warm-busier", loaded=frozenset({"a"}), load=3),
        HostView("warm", loaded=frozenset({"a"}), load=1),
    ]
    order = route("a", hosts, size=2 << 30)
    assert order == [
        Choice("warm", "warm"),
        Choice("warm-busier", "warm"),
        Choice("loading", "loading"),
        Choice("cold", "cold"),
        Choice("cold-small", "cold"),
        Choice("full", "saturated"),
    ]


def test_a_second_copy_only_when_every_holder_is_saturated() -> None:
    one_busy = [HostView("x", loaded=frozenset({"a"}), busy=frozenset({"a"})), HostView("y")]
    assert route("a", one_busy)[0] == Choice("y", "spill")
    room = [HostView("x", loaded=frozenset({"a"})), HostView("y")]
    assert route("a", room)[0] == Choice("x", "warm")
    # Busy with another model is no reason to spill this one.
    other_busy = [HostView("x", loaded=frozenset({"a"}), busy=frozenset({"b"})), HostView("y")]
    assert route("a", other_busy)[0] == Choice("x", "warm")


def test_the_host_a_cold_model_was_just_sent_to_counts_as_loading() -> None:
    hosts = [HostView(name) for name in NAMES]
    first = route("a", hosts)[0]
    other = next(name for name in NAMES if name != first.host)
    assert route("a", hosts, recent={"a": other})[0] == Choice(other, "loading")
    assert route("b", hosts, recent={"a": other})[0].kind == "cold"


@SETTINGS
@given(views(), st.sampled_from(MODELS), sizes, recents)
def test_never_cold_while_a_warm_host_has_room(
    hosts: list[HostView], model: str, size: int | None, recent: dict[str, str]
) -> None:
    first = route(model, hosts, size=size, recent=recent)[0]
    warm = [h for h in hosts if model in h.loaded and not h.saturated_for(model)]
    if warm:
        assert first.kind == "warm"
        assert first.host in {h.host for h in warm}
    holding = [
        h for h in hosts
        if (model in h.loaded or model in h.loading or recent.get(model) == h.host)
        and not h.saturated_for(model)
    ]  # fmt: skip
    if first.kind in ("cold", "spill"):
        assert holding == []


@SETTINGS
@given(views(), st.sampled_from(MODELS), sizes, recents, st.data())
def test_removing_a_host_moves_only_that_hosts_models(
    hosts: list[HostView], model: str, size: int | None, recent: dict[str, str], data: st.DataObject
) -> None:
    gone = data.draw(st.sampled_from(hosts)).host
    before = route(model, hosts, size=size, recent=recent)
    after = route(model, [h for h in hosts if h.host != gone], size=size, recent=recent)
    assert [c.host for c in after] == [c.host for c in before if c.host != gone]


@SETTINGS
@given(views(), st.sampled_from(MODELS), sizes, recents, st.randoms())
def test_the_order_does_not_depend_on_the_order_hosts_are_listed(
    hosts: list[HostView], model: str, size: int | None, recent: dict[str, str], rng
) -> None:
    shuffled = list(hosts)
    rng.shuffle(shuffled)
    assert route(model, shuffled, size=size, recent=recent) == route(
        model, hosts, size=size, recent=recent
    )


def test_every_host_appears_once() -> None:
    hosts = [HostView(name, loaded=frozenset({"a"}) if i % 2 else frozenset()) for i, name in
             enumerate(NAMES)]  # fmt: skip
    assert sorted(c.host for c in route("a", hosts)) == sorted(NAMES)


_IN_ANOTHER_PROCESS = """
import json, sys
from ollamatrio.fleet.routing import HostView, rendezvous_score, route
names = json.loads(sys.argv[1])
hosts = [HostView(n) for n in names]
print(json.dumps({
    "scores": [rendezvous_score(m, n) for m in "abcdefgh" for n in names],
    "orders": [[c.host for c in route(m, hosts)] for m in "abcdefgh"],
}))
"""


def test_the_order_is_the_same_in_every_process() -> None:
    """Two interpreters with different hash seeds (``str`` hashes differ) agree with this one."""
    here = {
        "scores": [rendezvous_score(m, n) for m in "abcdefgh" for n in NAMES],
        "orders": [[c.host for c in route(m, [HostView(n) for n in NAMES])] for m in "abcdefgh"],
    }
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", _IN_ANOTHER_PROCESS, json.dumps(NAMES)],
            env=env, capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        assert json.loads(out.stdout) == here
    # The hash spreads models over hosts (not every model on one host).
    assert len({order[0] for order in here["orders"]}) > 1
