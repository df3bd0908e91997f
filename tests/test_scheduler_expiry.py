"""Keep-alive expiry and eviction races, on the simulated engine in virtual time.

Regressions from a soak of the real server: a model that stayed loaded past its
keep-alive until another request came, requests that waited for a busy victim runner
while newcomers kept it busy, and ``/api/ps`` failing while a model loaded.
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ollamatrio.config import Settings
from ollamatrio.devices import SimulatedDevices
from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngineFactory
from ollamatrio.model_info import read_cached
from ollamatrio.scheduler import ModelRequest, Scheduler, open_scheduler
from ollamatrio.testing import write_tiny_gguf
from ollamatrio.wire import rfc3339_from_timestamp

LOAD_SECONDS = 1.0
# An evicted runner takes new requests for as long as it took to load, then it
# finishes the ones it has: at most the requests in its two slots, then the two already
# waiting for a slot, each at most 1.5 s in the tests below.  A request that waited for the
# victim to go then waits for the load, and for a slot as long again (the clients that
# waited with it may take the new runner's slots first).
DRAIN_SECONDS = 2 * 1.5
SERVED_WITHIN = LOAD_SECONDS + DRAIN_SECONDS + LOAD_SECONDS + DRAIN_SECONDS + 0.01


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("expiry-models")
    out = {}
    for name in ("a", "b", "c"):
        out[name] = write_tiny_gguf(root / f"{name}.gguf", ctx=8192, name=name, sparse=True)
        read_cached(str(out[name]))  # no thread hop on the first lease
    return out


def req(models: dict[str, Path], name: str, **kw: Any) -> ModelRequest:
    return ModelRequest(name=name, model_path=str(models[name]), **kw)


@asynccontextmanager
async def scheduler(**settings: Any) -> AsyncIterator[tuple[Scheduler, SimulatedEngineFactory]]:
    devices = SimulatedDevices(json.dumps({"gpus": [], "system": {"total": 64 << 30}}))
    engines = SimulatedEngineFactory(devices, default=SimulatedBehaviour(load_seconds=1.0))
    async with open_scheduler(Settings(**settings), engines=engines, devices=devices) as sched:
        yield sched, engines


def loaded(sched: Scheduler) -> list[str]:
    return sorted(i.name for i in sched.ps())


async def use(sched: Scheduler, request: ModelRequest, seconds: float = 0.0) -> None:
    async with sched.lease(request):
        await trio.sleep(seconds)


# -- keep-alive set by a lease the runner task never saw ---------------------------------


@pytest.mark.parametrize("before", [math.inf, 300.0], ids=["forever", "five-minutes"])
async def test_keep_alive_from_a_load_request_applies_while_idle(autojump_clock, models, before):
    """A load request (empty prompt) pins and unpins with no checkpoint in between: the
    runner task never sees it busy, yet its keep_alive must move the expiry."""
    async with scheduler() as (sched, _):
        await sched.load(req(models, "a", keep_alive=before))
        await trio.sleep(10)
        await sched.load(req(models, "a", keep_alive=2.0))
        await trio.sleep(1.9)
        assert loaded(sched) == ["a"]
        await trio.sleep(0.2)
        assert loaded(sched) == []


async def test_keep_alive_from_a_request_cancelled_at_once_applies(autojump_clock, models):
    """A client that leaves right after its lease is taken (the lease ends at its first
    checkpoint) still sets the keep-alive the runner expires by."""
    async with scheduler() as (sched, _):
        await sched.load(req(models, "a", keep_alive=math.inf))
        await trio.sleep(1)
        with trio.CancelScope() as scope:
            scope.cancel()
            await use(sched, req(models, "a", keep_alive=2.0), seconds=1)
        await trio.sleep(2.1)
        assert loaded(sched) == []


async def test_longer_keep_alive_from_an_unseen_lease_is_not_cut_short(autojump_clock, models):
    async with scheduler() as (sched, _):
        await sched.load(req(models, "a", keep_alive=5.0))
        await trio.sleep(4)
        await sched.load(req(models, "a", keep_alive=60.0))
        await trio.sleep(59)
        assert loaded(sched) == ["a"]
        await trio.sleep(1.1)
        assert loaded(sched) == []


# -- a busy victim drains ---------------------------------------------------------------


async def busy_clients(
    sched: Scheduler, request: ModelRequest, stop: trio.Event, count: int = 4
) -> None:
    """``count`` clients, more than the runner's slots, each using ``request`` for 0.5-1.5 s
    with short random gaps: the runner never goes idle on its own while they run."""

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        with trio.move_on_after(600):  # bounded, whatever the scheduler does
            while not stop.is_set():
                await use(sched, request, rng.uniform(0.5, 1.5))
                await trio.sleep(rng.uniform(0.0, 0.2))

    async with trio.open_nursery() as nursery:
        for seed in range(count):
            nursery.start_soon(client, seed)


async def waited_for(sched: Scheduler, request: ModelRequest, background: ModelRequest) -> float:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(busy_clients, sched, background, stop)
        await trio.sleep(5)
        started = trio.current_time()
        with trio.move_on_after(120):
            await use(sched, request)
        waited = trio.current_time() - started
        stop.set()
    return waited


async def test_a_busy_victim_takes_no_new_requests_so_the_waiting_load_goes_ahead(
    autojump_clock, models
):
    async with scheduler(max_loaded_models=1, num_parallel=2) as (sched, engines):
        waited = await waited_for(sched, req(models, "b"), req(models, "a"))
        assert waited < SERVED_WITHIN
        assert engines.loads >= 2


async def test_a_reload_is_not_starved_by_requests_the_old_runner_could_serve(
    autojump_clock, models
):
    """A request that needs another context evicts the runner (a reload); requests with the
    old context must not keep that runner busy forever."""
    async with scheduler(num_parallel=2) as (sched, engines):
        small = req(models, "a", options={"num_ctx": 512})
        waited = await waited_for(sched, req(models, "a", options={"num_ctx": 4096}), small)
        assert waited < SERVED_WITHIN
        assert engines.loads >= 2  # the small requests may then reload theirs


async def test_a_stopped_busy_model_takes_new_requests_only_briefly(autojump_clock, models):
    """A runner marked to unload still serves later requests, but only for as long as
    it took to load; after that they wait for it to go and load the model again."""
    async with scheduler(num_parallel=2) as (sched, engines):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"), 10)  # loaded at 1 s, busy until 11 s
            await trio.sleep(5)
            assert sched.unload(str(models["a"]))
            await use(sched, req(models, "a"))
            assert trio.current_time() == pytest.approx(5)  # served by the stopped runner
            await trio.sleep(LOAD_SECONDS + 0.5)
            started = trio.current_time()
            await use(sched, req(models, "a"))
            # The stopped runner finished its request at 11 s, then the model loaded again.
            assert trio.current_time() == pytest.approx(11 + LOAD_SECONDS)
            assert trio.current_time() - started > LOAD_SECONDS
        assert engines.loads == 2


async def test_a_model_loading_for_waiting_requests_is_not_an_idle_victim(autojump_clock, models):
    async with scheduler(max_loaded_models=2) as (sched, engines):
        await sched.load(req(models, "b", keep_alive=300.0))  # idle
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a", keep_alive=10.0), 5)
            await trio.sleep(0.1)
            assert [(i.name, i.state) for i in sched.ps() if i.name == "a"] == [("a", "loading")]
            nursery.start_soon(use, sched, req(models, "c", keep_alive=10.0), 5)
            await trio.sleep(0.5)
            # b (idle, though its keep-alive is longer) made room, not a (still loading).
            assert {i.name: i.state for i in sched.ps()} == {"a": "loading", "c": "loading"}
        assert engines.loads == 3


# -- /api/ps while a model loads --------------------------------------------------------


async def test_ps_while_loading_shows_a_finite_expiry(autojump_clock, models):
    async with scheduler(max_loaded_models=1) as (sched, _):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a", keep_alive=math.inf), 3)
            await trio.sleep(0.5)
            (info,) = sched.ps()
            assert info.state == "loading"
            assert info.expires_at is None  # forever, also while loading
            nursery.start_soon(use, sched, req(models, "b", keep_alive=60.0))
            seen = set()
            for _ in range(60):
                await trio.sleep(0.1)
                for info in sched.ps():
                    seen.add((info.name, info.state))
                    if info.keep_alive < math.inf:
                        assert info.expires_at is not None
                        assert math.isfinite(info.expires_at)
                    rfc3339_from_timestamp(info.expires_at)  # what /api/ps writes
        assert {("a", "unloading"), ("b", "loading")} <= seen


async def test_api_ps_answers_while_a_model_loads(api_server) -> None:
    behaviour = SimulatedBehaviour(load_seconds=1.0, tokens_per_second=2000)
    with trio.fail_after(30):
        async with (
            api_server(behaviour=behaviour) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=10) as client,
        ):
            body = {"model": "tiny", "prompt": "hi", "stream": False, "keep_alive": "1m"}
            async with trio.open_nursery() as nursery, srv.scheduler.events.subscribe() as events:
                nursery.start_soon(functools.partial(client.post, "/api/generate", json=body))
                async for event in events:  # the load has begun (it takes a second)
                    if event.kind == "loading":
                        break
                r = await client.get("/api/ps")
                assert r.status_code == 200, r.text
                (model,) = r.json()["models"]
                assert model["name"] == "tiny:latest"
