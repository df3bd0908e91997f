"""Per-model settings in the scheduler (``OLLAMATRIO_CONFIG``), on the simulated engine and
simulated GPUs, in virtual time: pinned models, slots, default context and keep_alive, and
the GPUs a model may use."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import test_scheduler
import trio

from ollamatrio.engines.simulated import SimulatedBehaviour
from ollamatrio.errors import InsufficientMemoryError, ModelLimitError, OutOfMemoryError
from ollamatrio.model_config import ModelConfig, parse_model_config

models = test_scheduler.models  # the sparse GB-sized models, as a fixture here too
req, scheduler, use = test_scheduler.req, test_scheduler.scheduler, test_scheduler.use
loaded, predicted_total, GiB = test_scheduler.loaded, test_scheduler.predicted_total, 1 << 30


def config(text: str) -> ModelConfig:
    return parse_model_config(text, Path("test.toml"))


PIN_A = config("[models.a]\npinned = true\n")


# -- pinned ------------------------------------------------------------------------------


async def busy_then_third(sched, models, seconds: float = 50) -> float:
    """a idle, b busy for ``seconds``, then c must make room: returns when c got it."""
    await use(sched, req(models, "a"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(use, sched, req(models, "b"), seconds)
        await trio.sleep(2)  # b loaded and busy
        await use(sched, req(models, "c"))
        return trio.current_time()


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "control"])
async def test_pinned_model_is_not_evicted_for_memory(autojump_clock, models, pinned):
    size = predicted_total(models["a"])
    gpu = {"id": "sim0", "total": int(size * 2.5)}  # room for two
    cfg = PIN_A if pinned else ModelConfig()
    async with scheduler(gpus=[gpu], config=cfg) as (sched, _, _):
        done = await busy_then_third(sched, models)
        # An idle victim goes before a busy one, unless it is pinned: then c waits for b.
        assert loaded(sched) == (["a", "c"] if pinned else ["b", "c"])
        assert done == pytest.approx(53 if pinned else 4, abs=0.1)


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "control"])
async def test_pinned_model_is_not_evicted_for_the_model_count(autojump_clock, models, pinned):
    cfg = PIN_A if pinned else ModelConfig()
    async with scheduler(max_loaded_models=2, config=cfg) as (sched, _, _):
        done = await busy_then_third(sched, models)
        assert loaded(sched) == (["a", "c"] if pinned else ["b", "c"])
        assert done == pytest.approx(53 if pinned else 4, abs=0.1)


async def test_when_every_resident_model_is_pinned_the_count_limit_fails_at_once(
    autojump_clock, models
):
    cfg = config("[models.a]\npinned = true\n[models.b]\npinned = true\n")
    async with scheduler(max_loaded_models=2, config=cfg) as (sched, _, _):
        await use(sched, req(models, "a"))
        await use(sched, req(models, "b"))
        started = trio.current_time()
        with pytest.raises(ModelLimitError) as caught:
            await use(sched, req(models, "c"))
        assert trio.current_time() == started  # no wait: nothing would ever make room
        assert str(caught.value) == (
            "cannot load c: the 2 loaded models are pinned and at most 2 may be loaded "
            "(OLLAMA_MAX_LOADED_MODELS)"
        )
        assert loaded(sched) == ["a", "b"]
        assert sched.waiting == 0
        # An explicit unload still unloads a pinned model, and then c fits.
        sched.unload(str(models["a"]))
        await use(sched, req(models, "c"))
        assert loaded(sched) == ["b", "c"]


async def test_only_pinned_models_in_the_way_of_memory_is_insufficient_memory(
    autojump_clock, models
):
    size = predicted_total(models["a"])
    async with scheduler(system_total=int(size * 1.5), config=PIN_A) as (sched, _, _):
        await use(sched, req(models, "a"))
        with pytest.raises(InsufficientMemoryError) as caught:
            await use(sched, req(models, "b"))
        assert str(caught.value).startswith("model b requires more system memory (")
        assert str(caught.value).endswith("than is available (pinned models are never evicted: a)")
        assert loaded(sched) == ["a"]


async def test_pinned_model_never_expires_and_ignores_request_keep_alive(autojump_clock, models):
    async with scheduler(keep_alive=5.0, config=PIN_A) as (sched, _, _):
        await use(sched, req(models, "a", keep_alive=0))
        await use(sched, req(models, "a", keep_alive=60))
        await trio.sleep(10 * 365 * 86400)
        assert loaded(sched) == ["a"]
        (info,) = sched.ps()
        assert (info.keep_alive, info.expires_at, info.pinned) == (math.inf, None, True)
        await use(sched, req(models, "b"))  # not pinned: the server-wide 5 s
        await trio.sleep(6)
        assert loaded(sched) == ["a"]
        # An explicit unload (/api/generate with keep_alive 0 and no prompt, `stop`) works.
        assert sched.unload(str(models["a"])) is True
        await trio.sleep(0.001)
        assert loaded(sched) == []
        # Loaded again by a request, it is pinned again.
        await use(sched, req(models, "a", keep_alive=0))
        await trio.sleep(3600)
        assert loaded(sched) == ["a"]


async def test_runtime_oom_does_not_unload_pinned_models(autojump_clock, models):
    behaviours = {"b": SimulatedBehaviour(oom_at_runtime=True)}
    async with scheduler(behaviours=behaviours, config=PIN_A) as (sched, _, _):
        await use(sched, req(models, "a"))
        await use(sched, req(models, "c"))
        with pytest.raises(OutOfMemoryError):
            await test_scheduler.generate(sched, req(models, "b"))
        await trio.sleep(0.001)
        assert loaded(sched) == ["a"]


async def test_load_oom_retry_does_not_evict_pinned_models(autojump_clock, models):
    behaviours = {"c": SimulatedBehaviour(fail_load="oom")}
    async with scheduler(behaviours=behaviours, config=PIN_A) as (sched, engines, _):
        await use(sched, req(models, "a"))
        await use(sched, req(models, "b"))
        with pytest.raises(OutOfMemoryError):
            await use(sched, req(models, "c", options={"num_ctx": 2048}))
        assert loaded(sched) == ["a"]  # b went for the out-of-memory retry, a stayed
        assert engines.loads == 4  # a, b, c, c again


# -- slots, context, keep_alive ------------------------------------------------------------


async def test_per_model_num_parallel_gives_that_many_slots(autojump_clock, models):
    cfg = config("[models.a]\nnum_parallel = 3\n")
    async with scheduler(config=cfg) as (sched, _, _):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(use, sched, req(models, "a"), 10)
        assert trio.current_time() == pytest.approx(11, abs=0.01)  # one load, then together
        await use(sched, req(models, "b"))
        slots = {i.name: i.num_parallel for i in sched.ps()}
        assert slots == {"a": 3, "b": 1}


async def test_per_model_num_ctx_is_the_default_and_a_request_still_wins(autojump_clock, models):
    cfg = config("[models.a]\nnum_ctx = 2048\n")
    async with scheduler(config=cfg) as (sched, engines, _):
        async with sched.lease(req(models, "a")) as lease:
            assert lease.runner.context_length == 2048
            assert not lease.runner.load.num_ctx_auto
        async with sched.lease(req(models, "b")) as lease:
            assert lease.runner.context_length == 4096  # the server-wide default
        async with sched.lease(req(models, "a", options={"num_ctx": 8192})) as lease:
            assert lease.runner.context_length == 8192  # a reload with the request's
        assert engines.loads == 3


async def test_per_model_keep_alive_is_the_default_and_a_request_still_wins(autojump_clock, models):
    cfg = config('[models.a]\nkeep_alive = "1m"\n')
    async with scheduler(config=cfg) as (sched, _, _):
        await use(sched, req(models, "a"))
        await trio.sleep(59.9)
        assert loaded(sched) == ["a"]
        await trio.sleep(0.2)
        assert loaded(sched) == []
        await use(sched, req(models, "b"))  # the server-wide 5 m
        await use(sched, req(models, "a", keep_alive=600))
        await trio.sleep(300)
        assert loaded(sched) == ["a"]


# -- gpus ---------------------------------------------------------------------------------


async def test_gpus_restrict_placement(autojump_clock, models):
    gpus = [{"id": "sim0", "total": 80 * GiB}, {"id": "sim1", "total": 40 * GiB}]
    cfg = config(
        '[models.a]\ngpus = ["sim1"]\n'  # by id; sim0 has more room
        "[models.b]\ngpus = [1]\n"  # by index
        '[models.c]\ngpus = "cpu"\n'
        "[models.d]\ngpus = []\n"
    )
    async with scheduler(gpus=gpus, config=cfg) as (sched, _, _):
        for name in "abcde":
            await use(sched, req(models, name))
        used = {i.name: sorted(i.vram_by_gpu) for i in sched.ps()}
        assert used == {"a": ["sim1"], "b": ["sim1"], "c": [], "d": [], "e": ["sim0"]}
        assert [i.size_vram for i in sched.ps() if i.name in "cd"] == [0, 0]


async def test_a_model_too_big_for_its_gpus_offloads_partially_there(autojump_clock, models):
    size = predicted_total(models["a"])
    gpus = [{"id": "sim0", "total": 80 * GiB}, {"id": "sim1", "total": size // 2}]
    cfg = config('[models.a]\ngpus = ["sim1"]\n')
    async with scheduler(gpus=gpus, config=cfg) as (sched, _, _):
        await use(sched, req(models, "a"))
        (info,) = sched.ps()
        assert sorted(info.vram_by_gpu) == ["sim1"]
        assert 0 < info.size_vram < info.size


# -- KV cache types ----------------------------------------------------------------------


async def test_kv_cache_types_per_model_and_per_side(autojump_clock, models):
    """The model's config names its sides, a request's options beat it, the server's type
    fills the rest; each load is booked at the types its runner will really use (a
    quantized V cache without flash attention at f16, as the runner falls back)."""
    cfg = config('[models.a]\nkv_cache_type = "q8_0"\nkv_cache_type_v = "f16"\n')
    async with scheduler(config=cfg, kv_cache_type="q4_0") as (sched, _, _):
        await use(sched, req(models, "a"))
        await use(sched, req(models, "b"))
        await use(sched, req(models, "c", options={"kv_cache_type_k": "f16"}))

        def sides(name: str) -> tuple[str, str]:
            runner = sched.runner(str(models[name]))
            assert runner is not None
            return runner.spec.kv_cache_type_k, runner.spec.kv_cache_type_v

        assert sides("a") == ("q8_0", "f16")
        assert sides("b") == ("q4_0", "q4_0")  # the runner will use f16 for V
        assert sides("c") == ("f16", "q4_0")
        size = {info.name: info.size for info in sched.ps()}
        # K: q4_0 < q8_0 < f16; V is f16 in all three.
        assert size["b"] < size["a"] < size["c"]
        # Another K type for the same model reloads it.
        await use(sched, req(models, "a", options={"kv_cache_type": "f16"}))
        assert sides("a") == ("f16", "f16")
