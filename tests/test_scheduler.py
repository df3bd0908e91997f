"""Scheduler behaviour on the simulated engine and simulated devices, in virtual time."""

from __future__ import annotations

import json
import math
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from ollamatrio.config import Settings
from ollamatrio.devices import SimulatedDevices
from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngineFactory
from ollamatrio.errors import (
    InsufficientMemoryError,
    OutOfMemoryError,
    QueueFullError,
    RunnerCrashedError,
    RunnerStartError,
)
from ollamatrio.gguf import read_gguf
from ollamatrio.memory import MemoryOptions, estimate, gpu_context_reserve
from ollamatrio.model_config import ModelConfig
from ollamatrio.model_info import read_cached
from ollamatrio.scheduler import ModelRequest, Scheduler, open_scheduler
from ollamatrio.testing import write_tiny_gguf
from ollamatrio.types import CompletionRequest

GiB = 1 << 30


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Sparse llama-shaped models: declared GB sizes, no disk.  Names a-e are ~the same
    size; 'big' is about twice as large, 'small' a tenth."""
    root = tmp_path_factory.mktemp("sched-models")
    shapes = {
        "a": 8, "b": 8, "c": 8, "d": 8, "e": 8,
        "big": 18, "small": 1,
    }  # fmt: skip
    out = {}
    for name, layers in shapes.items():
        out[name] = write_tiny_gguf(
            root / f"{name}.gguf",
            layers=layers,
            embd=4096,
            heads=32,
            kv_heads=8,
            ff=11008,
            vocab=32000,
            ctx=8192,
            dtype="f16",
            sparse=True,
            name=name,
        )
        read_cached(str(out[name]))  # warm the header cache: no thread hops in timed tests
    return out


def predicted_total(path: Path, num_ctx: int = 4096, num_parallel: int = 1) -> int:
    est = estimate(read_gguf(path), MemoryOptions(num_ctx=num_ctx, num_parallel=num_parallel))
    return est.total


def req(models: dict[str, Path], name: str, **kw: Any) -> ModelRequest:
    return ModelRequest(name=name, model_path=str(models[name]), **kw)


@asynccontextmanager
async def scheduler(
    *,
    gpus: list[dict[str, Any]] | None = None,
    system_total: int = 256 * GiB,
    behaviours: dict[str, SimulatedBehaviour] | None = None,
    default: SimulatedBehaviour | None = None,
    config: ModelConfig | None = None,
    **settings: Any,
) -> AsyncIterator[tuple[Scheduler, SimulatedEngineFactory, SimulatedDevices]]:
    devices = SimulatedDevices(
        json.dumps({"gpus": gpus or [], "system": {"total": system_total, "cpu_count": 2}})
    )
    engines = SimulatedEngineFactory(
        devices, default=default or SimulatedBehaviour(load_seconds=1.0), models=behaviours
    )
    base = Settings()
    async with open_scheduler(
        replace(base, **settings), engines=engines, devices=devices, models=config
    ) as sched:
        yield sched, engines, devices


def loaded(sched: Scheduler) -> list[str]:
    return sorted(i.name for i in sched.ps())


async def use(sched: Scheduler, request: ModelRequest, seconds: float = 0.0) -> None:
    async with sched.lease(request):
        await trio.sleep(seconds)


async def generate(sched: Scheduler, request: ModelRequest) -> None:
    """One whole generation on a leased runner."""
    async with sched.lease(request) as lease:
        async with lease.engine.complete(CompletionRequest(prompt="x")) as chunks:
            async for _ in chunks:
                pass


# -- leases and keep-alive ---------------------------------------------------------------


async def test_lease_loads_counts_and_expires_after_keep_alive(autojump_clock, models):
    async with scheduler() as (sched, engines, _):
        async with sched.lease(req(models, "a")) as lease:
            assert lease.load_duration == pytest.approx(1.0, abs=0.01)
            (info,) = sched.ps()
            assert (info.name, info.refs, info.state) == ("a", 1, "ready")
        assert sched.ps()[0].refs == 0
        await trio.sleep(299.9)
        assert loaded(sched) == ["a"]
        await trio.sleep(0.2)
        assert loaded(sched) == []
        assert engines.loads == 1


async def test_second_lease_reuses_runner_without_loading(autojump_clock, models):
    async with scheduler() as (sched, engines, _):
        await use(sched, req(models, "a"))
        start = trio.current_time()
        async with sched.lease(req(models, "a")) as lease:
            assert lease.load_duration == 0
            assert trio.current_time() == start  # fast path: no wait at all
        assert engines.loads == 1


@pytest.mark.parametrize(
    ("keep_alive", "alive_after"),
    [(0.0, 0.0), (60.0, 59.0), (math.inf, 10 * 365 * 86400.0)],
    ids=["zero-unloads-when-idle", "one-minute", "forever"],
)
async def test_keep_alive_values(autojump_clock, models, keep_alive, alive_after):
    async with scheduler() as (sched, _, _):
        await use(sched, req(models, "a", keep_alive=keep_alive), seconds=5)
        if keep_alive == 0:
            await trio.sleep(0.001)
            assert loaded(sched) == []
            return
        await trio.sleep(alive_after)
        assert loaded(sched) == ["a"]
        if math.isinf(keep_alive):
            assert sched.ps()[0].expires_at is None


async def test_keep_alive_last_writer_wins_and_omitted_keeps_value(autojump_clock, models):
    async with scheduler() as (sched, _, _):
        await use(sched, req(models, "a", keep_alive=600))
        await use(sched, req(models, "a"))  # omitted: stays 600
        assert sched.ps()[0].keep_alive == 600
        await trio.sleep(599)
        assert loaded(sched) == ["a"]
        await use(sched, req(models, "a", keep_alive=10))
        await trio.sleep(10.1)
        assert loaded(sched) == []


async def test_default_keep_alive_from_settings(autojump_clock, models):
    async with scheduler(keep_alive=30.0) as (sched, _, _):
        await use(sched, req(models, "a"))
        await trio.sleep(29.9)
        assert loaded(sched) == ["a"]
        await trio.sleep(0.2)
        assert loaded(sched) == []


async def test_busy_runner_does_not_expire_and_expires_at_stays_in_future(autojump_clock, models):
    async with scheduler(keep_alive=60.0) as (sched, _, _):
        async with sched.lease(req(models, "a")):
            for _ in range(5):
                await trio.sleep(100)  # far past the keep-alive
                (info,) = sched.ps()
                assert info.state == "ready"
                assert info.expires_at is not None
                assert info.expires_at >= trio.current_time() - 1  # never in the past
        await trio.sleep(59)
        assert loaded(sched) == ["a"]
        await trio.sleep(2)
        assert loaded(sched) == []


async def test_cancelled_lease_gives_its_reference_back(autojump_clock, models):
    async with scheduler(keep_alive=0.0) as (sched, _, _):
        with trio.move_on_after(5):
            async with sched.lease(req(models, "a")):
                assert sched.ps()[0].refs == 1
                await trio.sleep_forever()
        await trio.sleep(0.001)
        assert loaded(sched) == []  # refs went to 0, keep_alive 0 unloaded it


async def test_unload_request_expires_idle_runner_now(autojump_clock, models):
    async with scheduler() as (sched, _, _):
        await use(sched, req(models, "a"))
        assert sched.unload(str(models["a"])) is True
        await trio.sleep(0.001)
        assert loaded(sched) == []
        assert sched.unload(str(models["a"])) is False


async def test_stop_returns_once_an_idle_model_is_off_the_list(autojump_clock, models):
    """The unload answer is sent when an idle model is no longer listed: its process has
    exited (the placement pass still counts it while its VRAM comes back)."""
    async with scheduler() as (sched, _, _):
        await use(sched, req(models, "a"))
        assert await sched.stop(str(models["a"])) is True
        assert loaded(sched) == []
        assert await sched.stop(str(models["a"])) is False


async def test_stop_answers_at_once_for_a_busy_model(autojump_clock, models):
    async with scheduler() as (sched, _, _):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"), 20)
            await trio.sleep(5)
            assert await sched.stop(str(models["a"]))
            assert trio.current_time() == pytest.approx(5)
            assert [i.state for i in sched.ps()] == ["unloading"]
        await trio.sleep(0.001)
        assert loaded(sched) == []


async def test_unload_request_waits_for_busy_runner(autojump_clock, models):
    async with scheduler() as (sched, _, _):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"), 20)
            await trio.sleep(5)
            assert sched.unload(str(models["a"]))
            assert sched.ps()[0].state == "unloading"  # when its request finishes
            await trio.sleep(10)
            assert loaded(sched) == ["a"]  # still serving
        await trio.sleep(0.001)
        assert loaded(sched) == []


async def test_load_request_then_expiry(autojump_clock, models):
    async with scheduler(keep_alive=10.0) as (sched, _, _):
        lease = await sched.load(req(models, "a"))
        assert lease.load_duration == pytest.approx(1.0, abs=0.01)
        assert sched.ps()[0].refs == 0
        await trio.sleep(10.1)
        assert loaded(sched) == []


# -- the queue -----------------------------------------------------------------------------


async def test_queue_full_while_loading(autojump_clock, models):
    async with scheduler(max_queue=2) as (sched, _, _):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"))
            nursery.start_soon(use, sched, req(models, "b"))
            await trio.sleep(0.1)
            assert sched.waiting == 2
            with pytest.raises(QueueFullError) as exc:
                await use(sched, req(models, "c"))
            assert str(exc.value) == (
                "server busy, please try again.  maximum pending requests exceeded"
            )


async def test_slot_waiters_of_a_loaded_model_count_against_the_queue(autojump_clock, models):
    async with scheduler(max_queue=1, num_parallel=1) as (sched, _, _):
        await use(sched, req(models, "a"))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"), 10)  # holds the only slot
            nursery.start_soon(use, sched, req(models, "a"), 10)  # waits for it
            await trio.sleep(1)
            assert sched.waiting == 1
            assert sched.queue_depth() == {"a": 1}
            with pytest.raises(QueueFullError):
                await use(sched, req(models, "a"))
        assert sched.waiting == 0


async def test_ps_counts_active_and_queued_requests_and_slots(autojump_clock, models):
    async with scheduler(num_parallel=1, max_loaded_models=1) as (sched, _, _):
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(use, sched, req(models, "a"), 10)
            await trio.sleep(0.5)  # the load takes 1 s: both wait for it
            (info,) = sched.ps()
            assert (info.state, info.active, info.queued, info.num_parallel) == (
                "loading", 0, 2, 1,
            )  # fmt: skip
            await trio.sleep(1)  # loaded: one holds the only slot, the other waits for it
            (info,) = sched.ps()
            assert (info.state, info.refs, info.active, info.queued) == ("ready", 2, 1, 1)
            # A larger context needs a reload: the request waits in the pending list, under
            # its model, while the old runner finishes its two requests.
            nursery.start_soon(use, sched, req(models, "a", options={"num_ctx": 8192}))
            await trio.sleep(0.5)
            (info,) = sched.ps()
            assert (info.state, info.active, info.queued) == ("unloading", 1, 2)
            assert sched.queue_depth() == {"a": 2}
        (info,) = sched.ps()
        assert (info.state, info.context_length, info.active, info.queued) == ("ready", 8192, 0, 0)


async def test_parallel_slots_serve_concurrently(autojump_clock, models):
    async with scheduler(num_parallel=2) as (sched, _, _):
        await use(sched, req(models, "a"))
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(use, sched, req(models, "a"), 10)
        assert trio.current_time() - start == pytest.approx(20, abs=0.01)


async def test_request_cancelled_while_queued_leaves_nothing_behind(autojump_clock, models):
    async with scheduler(default=SimulatedBehaviour(load_seconds=30)) as (sched, engines, _):
        with trio.move_on_after(5):
            await use(sched, req(models, "a"))
        assert sched.waiting == 0
        await trio.sleep(0.001)
        assert loaded(sched) == []  # nobody wanted the load any more: abandoned
        assert "a" not in engines.engines


async def test_a_request_right_after_an_abandoned_load_gets_a_fresh_one(autojump_clock, models):
    """A load whose only client left is abandoned at once; a request for the same model
    that arrives before the runner task has ended that load must not join it (it would
    fail with "load abandoned"), whichever task Trio runs first: it waits for a new load."""
    async with scheduler(default=SimulatedBehaviour(load_seconds=30)) as (sched, _, _):
        for _ in range(20):  # Trio picks the order of ready tasks at random: try many
            with trio.move_on_after(5):
                await use(sched, req(models, "a"))
            # Cancelled and forgotten: the load is abandoned, its task not yet run.
            await use(sched, req(models, "a"))
            assert loaded(sched) == ["a"]
            sched.unload(str(models["a"]))
            await trio.sleep(1)
            assert loaded(sched) == []


async def test_load_continues_while_another_request_still_wants_it(autojump_clock, models):
    async with scheduler(default=SimulatedBehaviour(load_seconds=30)) as (sched, _, _):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"))
            with trio.move_on_after(5):
                await use(sched, req(models, "a"))
        assert trio.current_time() == pytest.approx(30, abs=0.01)
        assert loaded(sched) == ["a"]


# -- reload rules --------------------------------------------------------------------------


async def test_a_different_num_ctx_reloads_smaller_or_larger(autojump_clock, models):
    """As Ollama compares load options: a runner with another explicit context never serves
    the request, a smaller context included."""
    async with scheduler() as (sched, engines, _):
        await use(sched, req(models, "a", options={"num_ctx": 2048}))
        await use(sched, req(models, "a", options={"num_ctx": 2048}))
        assert engines.loads == 1
        await use(sched, req(models, "a", options={"num_ctx": 1024}))
        assert engines.loads == 2
        assert [(i.context_length, i.state) for i in sched.ps()] == [(1024, "ready")]
        await use(sched, req(models, "a", options={"num_ctx": 8192}))
        assert engines.loads == 3
        (info,) = sched.ps()
        assert info.context_length == 8192


async def test_a_model_made_from_another_gets_a_runner_under_its_own_name(autojump_clock, models):
    """Two names, one weights file: the one with other parameters (Ollama's ``FROM smol``
    plus ``num_ctx 1024``) reloads the file's runner and is listed under its own name; a
    name with the same parameters shares the runner, listed under the name that loaded it
    (Ollama lists the runner's model)."""
    path = str(models["a"])
    smol = ModelRequest(name="smol:latest", model_path=path)
    smol2 = ModelRequest(name="smol2:latest", model_path=path, options={"num_ctx": 1024})
    same = ModelRequest(name="same:latest", model_path=path)
    async with scheduler() as (sched, engines, _):
        await use(sched, smol)
        await use(sched, smol2)
        assert [(i.name, i.context_length) for i in sched.ps()] == [("smol2:latest", 1024)]
        await use(sched, smol)
        await use(sched, same)
        assert [(i.name, i.context_length) for i in sched.ps()] == [("smol:latest", 4096)]
        assert engines.loads == 3


async def test_options_a_runner_was_loaded_with_reload_when_a_request_leaves_them_unset(
    autojump_clock, models
):
    """Ollama compares the load-time options both ways: a runner loaded with num_thread,
    use_mmap or main_gpu set does not serve a request that leaves them at the default."""
    async with scheduler() as (sched, engines, _):
        for option in ({"num_thread": 1}, {"use_mmap": False}, {"num_batch": 128}):
            loads = engines.loads
            await use(sched, req(models, "a", options=option))
            await use(sched, req(models, "a"))
            assert engines.loads == loads + 2, option


async def test_embeddings_reload_a_chat_runner_once_into_one_that_serves_both(
    autojump_clock, models
):
    """One runner per model file: an embedding request reloads a runner loaded without
    embedding mode; the new one (embedding mode, the chat model's slots) serves both kinds
    of request, so the model is listed once and never reloads back."""
    async with scheduler(num_parallel=2) as (sched, engines, _):
        await use(sched, req(models, "a"))
        assert not sched.runner(str(models["a"])).spec.embedding
        await use(sched, req(models, "a", embeddings=True))
        runner = sched.runner(str(models["a"]))
        assert runner.spec.embedding
        assert runner.spec.num_parallel == 2
        for embeddings in (False, True, False):
            await use(sched, req(models, "a", embeddings=embeddings))
        assert engines.loads == 2
        assert [(i.name, i.state) for i in sched.ps()] == [("a", "ready")]


async def test_num_ctx_clamped_to_training_context(autojump_clock, models):
    async with scheduler() as (sched, _, _):
        await use(sched, req(models, "a", options={"num_ctx": 1_000_000}))
        assert sched.ps()[0].context_length == 8192


async def test_different_adapters_reload(autojump_clock, models):
    async with scheduler() as (sched, engines, _):
        await use(sched, req(models, "a"))
        await use(sched, req(models, "a", adapters=("/adapters/one.gguf",)))
        await use(sched, req(models, "a", adapters=("/adapters/one.gguf",)))
        assert engines.loads == 2
        (info,) = sched.ps()
        assert sched.runner(info.model_path).spec.adapters == ("/adapters/one.gguf",)


async def test_sampling_options_and_negative_num_gpu_never_reload(autojump_clock, models):
    async with scheduler() as (sched, engines, _):
        await use(sched, req(models, "a"))
        await use(sched, req(models, "a", options={"temperature": 0.1, "num_gpu": -1}))
        assert engines.loads == 1


# -- eviction ------------------------------------------------------------------------------


async def test_max_loaded_models_evicts_idle_shortest_keep_alive(autojump_clock, models):
    async with scheduler(max_loaded_models=2) as (sched, _, _):
        await use(sched, req(models, "a", keep_alive=600))
        await use(sched, req(models, "b", keep_alive=60))
        await use(sched, req(models, "c"))
        assert loaded(sched) == ["a", "c"]


async def test_default_max_models_is_three_on_cpu(autojump_clock, models):
    async with scheduler() as (sched, _, _):
        for name in "abcd":
            await use(sched, req(models, name))
        assert len(sched.ps()) == 3


async def test_default_context_comes_from_the_first_inventory_for_every_model(
    autojump_clock, tmp_path
):
    # Models that train at 262144, so the tier is not hidden by a clamp.
    paths = {
        name: write_tiny_gguf(tmp_path / f"{name}.gguf", ctx=262144, name=name)
        for name in ("first", "second")
    }
    gpu = {"id": "sim0", "total": 80 * GiB}
    async with scheduler(gpus=[gpu], context_length=0, max_loaded_models=2) as (sched, _, _):
        assert sched.default_context_length == 262144
        assert sched.max_loaded_models == 2
        seen = {}
        for name, path in paths.items():
            async with sched.lease(ModelRequest(name=name, model_path=str(path))) as lease:
                seen[name] = lease.runner.context_length
        assert seen == {"first": 262144, "second": 262144}


async def test_automatic_max_models_comes_from_the_first_inventory(autojump_clock, models):
    gpus = [{"id": f"sim{i}", "total": 80 * GiB} for i in range(2)]
    async with scheduler(gpus=gpus) as (sched, _, _):
        assert sched.max_loaded_models == 6


async def test_gpu_loads_book_the_runner_gpu_context(autojump_clock, models):
    gpu = {"id": "sim0", "total": 80 * GiB}
    async with scheduler(gpus=[gpu]) as (sched, _, devices):
        await use(sched, req(models, "a"))
        runner = sched.runner(str(models["a"]))
        assert runner is not None
        est = estimate(read_gguf(models["a"]), MemoryOptions(num_ctx=runner.load.num_ctx))
        predicted = runner.placement.vram_by_gpu["sim0"]
        assert runner.placement.reserve_by_gpu == {"sim0": gpu_context_reserve("CUDA")}
        assert predicted == sum(est.layer_sizes) + est.output_weights + est.gpu_graph_full + (
            gpu_context_reserve("CUDA")
        )
        # What the simulated runner holds (context included) is what was booked.
        assert devices.usage(runner.name + "#0") == {"sim0": predicted}


async def test_measured_vram_corrects_later_placements_on_that_gpu(autojump_clock, models):
    gpu = {"id": "sim0", "total": 80 * GiB}
    # Every model really takes 20 % more VRAM than predicted.
    heavy = SimulatedBehaviour(load_seconds=1.0, vram_factor=1.2)
    async with scheduler(gpus=[gpu], default=heavy, max_loaded_models=5) as (sched, _, _):
        await use(sched, req(models, "a"))
        first = sched.runner(str(models["a"]))
        assert first is not None
        assert first.memory.vram_by_gpu["sim0"] > first.placement.vram_by_gpu["sim0"] * 1.1
        assert sched.calibration.factor("sim0") == pytest.approx(1.2, rel=0.01)

        await use(sched, req(models, "b"))
        second = sched.runner(str(models["b"]))
        assert second is not None
        predicted = second.placement.vram_by_gpu["sim0"]
        measured = second.memory.vram_by_gpu["sim0"]
        assert predicted == pytest.approx(measured, rel=0.01)


async def test_busy_runner_is_not_evicted_until_idle(autojump_clock, models):
    async with scheduler(max_loaded_models=1) as (sched, _, _):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"), 50)
            await trio.sleep(2)
            await use(sched, req(models, "b"))
            # b waited for a's request to finish, then for b's load
            assert trio.current_time() == pytest.approx(52, abs=0.1)
        assert loaded(sched) == ["b"]


async def test_eviction_with_equal_keep_alive_takes_the_least_recently_used(autojump_clock, models):
    async with scheduler(max_loaded_models=3) as (sched, _, _):
        for name in "abc":
            await use(sched, req(models, name))
        await use(sched, req(models, "a"), seconds=5)
        await use(sched, req(models, "d"))
        # b has been idle the longest; a (first by file name) was used a moment ago.
        assert loaded(sched) == ["a", "c", "d"]


async def test_eviction_takes_the_model_that_would_expire_soonest(autojump_clock, models):
    async with scheduler(max_loaded_models=3) as (sched, _, _):
        await sched.load(req(models, "a", keep_alive=600))  # idle from 1 s: expires at 601
        await sched.load(req(models, "b", keep_alive=900))  # from 2 s: at 902
        await trio.sleep_until(500)
        await sched.load(req(models, "c", keep_alive=300))  # from 501 s: at 801
        await sched.load(req(models, "d"))  # 5 m by default, from 502 s: at 802
        # a's keep-alive is twice c's, but a has 99 s left and c 299 s.
        assert loaded(sched) == ["b", "c", "d"]
        # c goes before d (one second apart) and b, although both were used less recently.
        await sched.load(req(models, "e"))
        assert loaded(sched) == ["b", "d", "e"]


async def test_eviction_never_takes_a_busy_model_while_one_is_idle(autojump_clock, models):
    async with scheduler(max_loaded_models=3) as (sched, _, _):
        async with trio.open_nursery() as nursery:
            # Busy for good, with the shortest keep-alive and the oldest use of all.
            nursery.start_soon(use, sched, req(models, "a", keep_alive=10), 10_000)
            await trio.sleep(2)
            await sched.load(req(models, "b", keep_alive=600))  # idle from 3 s: at 603
            await trio.sleep_until(500)
            await sched.load(req(models, "c", keep_alive=300))  # idle from 501 s: at 801
            await sched.load(req(models, "d"))
            assert loaded(sched) == ["a", "c", "d"]  # b: idle and soonest to expire
            nursery.cancel_scope.cancel()


async def test_eviction_ties_broken_by_last_use_not_by_path(autojump_clock, models):
    async with scheduler(max_loaded_models=2) as (sched, _, _):
        await sched.load(req(models, "b", keep_alive=250))
        await sched.load(req(models, "a", keep_alive=200))
        await trio.sleep_until(100)
        await sched.load(req(models, "b"))  # expires at 350
        await trio.sleep_until(150)
        await sched.load(req(models, "a"))  # expires at 350 too, but was used later
        a, b = (sched.runner(str(models[name])) for name in "ab")
        assert a is not None
        assert b is not None
        assert a.expiry() == b.expiry()
        await sched.load(req(models, "c"))
        assert loaded(sched) == ["a", "c"]


async def test_eviction_frees_only_as_much_gpu_memory_as_needed(autojump_clock, models):
    size = predicted_total(models["a"])
    gpu = {"id": "sim0", "total": int(size * 3.5)}  # room for three
    async with scheduler(gpus=[gpu]) as (sched, _, _):
        for name, ka in (("a", 300), ("b", 100), ("c", 200)):
            await use(sched, req(models, name, keep_alive=ka))
        assert loaded(sched) == ["a", "b", "c"]
        assert all(i.size_vram > 0 for i in sched.ps())
        await use(sched, req(models, "d", keep_alive=300))
        assert loaded(sched) == ["a", "c", "d"]  # only b (shortest keep-alive) went


async def test_eviction_never_evicts_a_runner_it_does_not_need_gone(autojump_clock, models):
    big = predicted_total(models["big"])
    size = predicted_total(models["a"])
    gpus = [
        {"id": "sim0", "total": int(big * 1.1)},  # only big's replacement fits here
        {"id": "sim1", "total": int(size * 1.2)},
    ]
    async with scheduler(gpus=gpus, max_loaded_models=5) as (sched, _, _):
        await use(sched, req(models, "big", keep_alive=900))  # sim0
        await use(sched, req(models, "a", keep_alive=10))  # sim1
        by_name = {i.name: set(i.vram_by_gpu) for i in sched.ps()}
        assert by_name == {"big": {"sim0"}, "a": {"sim1"}}
        # b fits on sim1 once a is gone; a has the shortest keep-alive anyway, and
        # big (on the other GPU) must stay.
        await use(sched, req(models, "b", keep_alive=5))
        assert loaded(sched) == ["b", "big"]


async def test_smallest_gpu_group_that_fits(autojump_clock, models):
    big = predicted_total(models["big"])
    gpus = [{"id": f"sim{i}", "total": int(big * 0.6)} for i in range(4)]
    async with scheduler(gpus=gpus) as (sched, _, _):
        await use(sched, req(models, "big"))
        (info,) = sched.ps()
        assert len(info.vram_by_gpu) == 2
        assert info.size_vram > 0


async def test_partial_offload_when_nothing_fits_alone(autojump_clock, models):
    big = predicted_total(models["big"])
    async with scheduler(gpus=[{"id": "sim0", "total": big // 2}]) as (sched, _, _):
        await use(sched, req(models, "big"))
        (info,) = sched.ps()
        assert 0 < info.size_vram < info.size


async def test_cpu_loads_check_host_memory(autojump_clock, models):
    size = predicted_total(models["a"])
    async with scheduler(system_total=int(size * 1.5)) as (sched, _, _):
        await use(sched, req(models, "a"))
        await use(sched, req(models, "b"))  # does not fit beside a: a is evicted
        assert loaded(sched) == ["b"]
        with pytest.raises(InsufficientMemoryError):
            await use(sched, req(models, "big"))
        assert loaded(sched) == ["b"]


async def test_requests_needing_eviction_are_served_in_arrival_order(autojump_clock, models):
    order: list[str] = []

    async def run(name: str) -> None:
        async with sched.lease(req(models, name)):
            order.append(name)

    async with scheduler(max_loaded_models=1) as (sched, _, _):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"), 10)
            await trio.sleep(2)
            for name in "bcd":
                nursery.start_soon(run, name)
                await trio.sleep(0.01)
        assert order == ["b", "c", "d"]


# -- no head-of-line blocking --------------------------------------------------------------


async def test_loaded_model_is_not_blocked_by_another_models_load(autojump_clock, models):
    slow = SimulatedBehaviour(load_seconds=30)
    async with scheduler(behaviours={"a": slow}) as (sched, _, _):
        await use(sched, req(models, "b"))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"))
            await trio.sleep(1)
            start = trio.current_time()
            await use(sched, req(models, "b"))
            assert trio.current_time() - start < 0.01


async def test_model_that_fits_loads_beside_a_slow_load(autojump_clock, models):
    slow = SimulatedBehaviour(load_seconds=30)
    async with scheduler(behaviours={"a": slow}) as (sched, _, _):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"))
            await trio.sleep(1)
            start = trio.current_time()
            await use(sched, req(models, "b"))  # 1 s load, not 30
            assert trio.current_time() - start == pytest.approx(1.0, abs=0.01)


async def test_fitting_request_not_blocked_by_one_that_needs_eviction(autojump_clock, models):
    size = predicted_total(models["a"])
    small = predicted_total(models["small"])
    gpu = {"id": "sim0", "total": int(size * 2 + small * 1.5)}
    async with scheduler(gpus=[gpu], max_loaded_models=5) as (sched, _, _):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(use, sched, req(models, "a"), 100)  # busy for 100 s
            nursery.start_soon(use, sched, req(models, "b"), 100)
            await trio.sleep(2)
            nursery.start_soon(use, sched, req(models, "c"))  # needs a or b gone
            await trio.sleep(1)
            start = trio.current_time()
            await use(sched, req(models, "small"))  # fits beside them
            assert trio.current_time() - start == pytest.approx(1.0, abs=0.01)


# -- failures ------------------------------------------------------------------------------


async def test_load_error_reaches_requester_and_next_request_retries(autojump_clock, models):
    engines_behaviour = {"a": SimulatedBehaviour(load_seconds=1, fail_load="error")}
    async with scheduler(behaviours=engines_behaviour) as (sched, engines, _):
        with pytest.raises(RunnerStartError, match="error loading model"):
            await use(sched, req(models, "a"))
        assert loaded(sched) == []
        engines.models.clear()
        await use(sched, req(models, "a"))
        assert loaded(sched) == ["a"]


async def test_load_oom_retries_with_smaller_automatic_context(autojump_clock, models):
    # A 24 GiB GPU asks for the 32768 tier, clamped to the model's 8192 training context.
    gpu = {"id": "sim0", "total": 24 * GiB}
    async with scheduler(gpus=[gpu], context_length=0) as (sched, engines, _):
        assert sched.default_context_length == 32768
        engines.models["a"] = SimulatedBehaviour(load_seconds=1, fail_load="oom")

        original_open = engines.open

        @asynccontextmanager
        async def open_ok_when_small(spec, **kw):
            if spec.num_ctx <= 4096:
                engines.models.clear()
            async with original_open(spec, **kw) as engine:
                yield engine

        engines.open = open_ok_when_small  # type: ignore[method-assign]
        await use(sched, req(models, "a"))
        assert sched.ps()[0].context_length == 4096
        assert engines.loads == 2


async def test_load_oom_with_explicit_context_is_reported(autojump_clock, models):
    behaviours = {"a": SimulatedBehaviour(fail_load="oom")}
    async with scheduler(behaviours=behaviours) as (sched, _, _):
        with pytest.raises(OutOfMemoryError):
            await use(sched, req(models, "a", options={"num_ctx": 2048}))


async def test_crash_mid_stream_reaches_leaseholders_and_model_reloads(autojump_clock, models):
    behaviours = {"a": SimulatedBehaviour(crash_after_tokens=3, tokens_per_second=10)}
    async with scheduler(behaviours=behaviours) as (sched, engines, _):
        with pytest.raises(RunnerCrashedError):
            await generate(sched, req(models, "a"))
        await trio.sleep(0.001)
        assert loaded(sched) == []
        engines.models.clear()
        await use(sched, req(models, "a"))
        assert engines.loads == 2


async def test_runtime_oom_expires_idle_runners(autojump_clock, models):
    behaviours = {"b": SimulatedBehaviour(oom_at_runtime=True)}
    async with scheduler(behaviours=behaviours) as (sched, _, _):
        await use(sched, req(models, "a"))
        with pytest.raises(OutOfMemoryError):
            await generate(sched, req(models, "b"))
        await trio.sleep(0.001)
        assert loaded(sched) == []


# -- shutdown and scale --------------------------------------------------------------------


async def test_shutdown_unloads_everything(autojump_clock, models):
    gpus = [{"id": "sim0", "total": 512 * GiB}]
    async with scheduler(gpus=gpus) as (sched, engines, devices):
        for name in "abc":
            await use(sched, req(models, name, keep_alive=math.inf))
        assert len(engines.engines) == 3
    assert engines.engines == {}
    inventory = await devices.inventory()
    assert inventory.gpus[0].free == 512 * GiB


async def test_thousand_leases_with_random_cancellations(autojump_clock, models):
    rng = random.Random(7)
    names = ["a", "b", "c", "d", "e", "small"]
    async with scheduler(keep_alive=60.0, num_parallel=4, max_queue=2000) as (sched, _, _):

        async def one(i: int) -> None:
            name = rng.choice(names)
            with trio.move_on_after(rng.uniform(0, 20)):
                async with sched.lease(req(models, name)) as lease:
                    async with lease.engine.complete(CompletionRequest(prompt=f"p{i}")) as chunks:
                        async for _ in chunks:
                            pass

        async with trio.open_nursery() as nursery:
            for i in range(1000):
                nursery.start_soon(one, i)
        assert sched.waiting == 0
        assert all(i.refs == 0 for i in sched.ps())
        await trio.sleep(61)
        assert sched.ps() == []


# -- VRAM recovery -------------------------------------------------------------------------


class LaggingDevices(SimulatedDevices):
    """Reports freed GPU memory only after ``lag`` seconds, as drivers sometimes do."""

    def __init__(self, spec: str, lag: float) -> None:
        super().__init__(spec)
        self.lag = lag
        self.released_at: dict[str, float] = {}
        self.held: dict[str, dict[str, int]] = {}

    def release(self, owner: str) -> None:
        self.held[owner] = self.usage(owner)
        self.released_at[owner] = trio.current_time()
        super().release(owner)

    async def inventory(self):  # type: ignore[override]
        inv = await super().inventory()
        now = trio.current_time()
        lagging: dict[str, int] = {}
        for owner, at in self.released_at.items():
            if now - at < self.lag:
                for gpu_id, nbytes in self.held[owner].items():
                    lagging[gpu_id] = lagging.get(gpu_id, 0) + nbytes
        gpus = tuple(replace(g, free=max(0, g.free - lagging.get(g.id, 0))) for g in inv.gpus)
        return replace(inv, gpus=gpus)


@pytest.mark.parametrize(
    ("lag", "expected"), [(1.2, 1.25), (60.0, 5.0)], ids=["recovers", "gives-up"]
)
async def test_gpu_runner_waits_for_vram_recovery(autojump_clock, models, lag, expected):
    spec = json.dumps({"gpus": [{"id": "sim0", "total": "512GiB"}], "system": {"total": "64GiB"}})
    devices = LaggingDevices(spec, lag)
    engines = SimulatedEngineFactory(devices, default=SimulatedBehaviour(load_seconds=0))
    async with open_scheduler(
        replace(Settings(), keep_alive=0.0), engines=engines, devices=devices
    ) as sched:
        await use(sched, req(models, "a"))
        start = trio.current_time()
        await sched.wait_idle()
        assert trio.current_time() - start == pytest.approx(expected, abs=0.01)


async def test_ps_drops_a_stopped_runner_while_its_vram_comes_back(autojump_clock, models):
    """As Ollama: a runner whose process has exited is off ``/api/ps`` while the driver
    has not yet shown its memory free; the scheduler still holds it (and counts its
    memory) until then."""
    spec = json.dumps({"gpus": [{"id": "sim0", "total": "512GiB"}], "system": {"total": "64GiB"}})
    devices = LaggingDevices(spec, 60.0)
    engines = SimulatedEngineFactory(devices, default=SimulatedBehaviour(load_seconds=0))
    async with open_scheduler(
        replace(Settings(), keep_alive=0.0), engines=engines, devices=devices
    ) as sched:
        await use(sched, req(models, "a"))
        await trio.sleep(1)  # the driver has not shown the memory free yet
        assert sched.ps() == []
        (runner,) = sched.runners()
        assert runner.stopped
        assert runner.memory.vram > 0
        await sched.wait_idle()
        assert sched.runners() == []


async def test_cpu_runner_skips_vram_recovery(autojump_clock, models):
    async with scheduler(keep_alive=0.0, default=SimulatedBehaviour(load_seconds=0)) as (
        sched,
        _,
        _,
    ):
        await use(sched, req(models, "a"))
        start = trio.current_time()
        await sched.wait_idle()
        assert trio.current_time() == start
