"""The host-RAM prompt cache: its limit (config file, OLLAMATRIO_PROMPT_CACHE, derived from
the context and the free RAM) handed to the runner; what it holds booked by placement as it
grows, its growth granted only from memory nobody booked, shown in /api/ps and /metrics;
and every dialect's usage fields telling the reused part of a prompt from the evaluated part
(on the simulated engine, which reuses a shared prefix as llama.cpp does when asked to)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import test_metrics
import test_scheduler
import trio

from ollamatrio.config import Settings
from ollamatrio.engines.simulated import SimulatedBehaviour
from ollamatrio.gguf import read_gguf
from ollamatrio.memory import MemoryOptions, estimate, plan_layout
from ollamatrio.model_config import parse_model_config
from ollamatrio.scheduler.placement import choose_placement
from ollamatrio.scheduler.prompt_cache import (
    FREE_RAM_SHARE,
    STATES,
    MiB,
    grants,
    prompt_cache_bytes,
)
from ollamatrio.types import LoadSpec

models = test_scheduler.models  # the sparse GB-sized models, as a fixture here too
req, scheduler, use, GiB = test_scheduler.req, test_scheduler.scheduler, test_scheduler.use, 1 << 30
scrape, value = test_metrics.scrape, test_metrics.value

# -- the limit ---------------------------------------------------------------------------------


def limit(model: int | None = None, server: int = -1, *, free: int = 64 * GiB) -> int:
    return prompt_cache_bytes(
        model_mib=model, server_mib=server, kv_per_slot=100 * MiB, free_ram=free, embedding=False
    )


def test_the_model_setting_wins_then_the_server_setting_then_the_derived_limit() -> None:
    assert limit(model=300, server=200) == 300 * MiB
    assert limit(model=0, server=200) == 0  # off for this model only
    assert limit(server=200) == 200 * MiB
    assert limit(server=0) == 0  # off everywhere
    assert limit() == STATES * 100 * MiB


def test_the_derived_limit_takes_at_most_a_share_of_the_free_ram_in_whole_mib() -> None:
    free = 2 * GiB + 12345
    assert limit(free=free) == int(free * FREE_RAM_SHARE) // MiB * MiB
    assert limit(free=0) == 0


def test_embedding_runners_get_no_cache() -> None:
    assert prompt_cache_bytes(
        model_mib=100, server_mib=100, kv_per_slot=MiB, free_ram=GiB, embedding=True
    ) == 0  # fmt: skip


@pytest.mark.parametrize(("text", "mib"), [("", -1), ("0", 0), ("512", 512), ("lots", -1)])
def test_ollamatrio_prompt_cache_is_read_in_mib(text: str, mib: int) -> None:
    assert Settings.from_env({"OLLAMATRIO_PROMPT_CACHE": text}).prompt_cache_mib == mib


# -- placement ---------------------------------------------------------------------------------


def test_placement_books_none_of_the_limit_and_hands_it_to_the_runner(models) -> None:
    plain = estimate(read_gguf(models["a"]), MemoryOptions(num_ctx=4096))
    cached = plain.__class__(**{**_fields(plain), "prompt_cache": 300 * MiB})
    assert cached.total == plain.total  # the cache starts empty
    for gpus in ([], [("sim0", 80 * GiB)], [("sim0", plain.total // 3)]):
        with_cache, without = plan_layout(cached, gpus), plan_layout(plain, gpus)
        assert with_cache.host_bytes == without.host_bytes
        assert with_cache.vram_by_gpu == without.vram_by_gpu
    placement = choose_placement(cached, [], plain.total)  # room for the model alone
    assert placement is not None
    assert placement.prompt_cache == 300 * MiB


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}


def test_grants_share_the_spare_room_and_never_pass_a_limit() -> None:
    # (limit, held): the small need is met whole, the rest shared equally.
    assert grants([(100, 90), (1000, 0), (1000, 200)], 610) == [100, 300, 500]
    assert grants([(100, 0), (100, 50)], 10_000) == [100, 100]  # room for both limits
    assert grants([(100, 80), (100, 20)], 0) == [80, 20]  # no room: no growth
    assert grants([(100, 80)], -5) == [80]
    caches = [(500, 10), (300, 250), (800, 0), (64, 64)]
    for spare in (0, 1, 77, 400, 5000):
        given = grants(caches, spare)
        growth = sum(g - held for g, (_, held) in zip(given, caches, strict=True))
        assert growth <= spare
        assert all(held <= g <= most for g, (most, held) in zip(given, caches, strict=True))


async def test_the_runner_gets_the_limit_and_ps_shows_what_the_cache_holds(
    autojump_clock, models
) -> None:
    config = parse_model_config('[models.b]\nprompt_cache = 0\n[models.c]\nprompt_cache = 96\n',
                                Path("t.toml"))  # fmt: skip
    async with scheduler(prompt_cache_mib=64, config=config) as (sched, _, _):
        for name in ("a", "b", "c"):
            await use(sched, req(models, name))
        runners = {r.name: r for r in sched.runners()}
        infos = {info.name: info for info in sched.ps()}
    for name, mib in (("a", 64), ("b", 0), ("c", 96)):
        assert runners[name].spec.prompt_cache_mib == mib
        assert infos[name].prompt_cache_limit == mib * MiB
        assert infos[name].prompt_cache == 0  # nothing saved yet
        # The model with its context, as the runner measured it: never the cache's limit.
        assert infos[name].size == runners[name].engine.memory.total


STATE = 10 * MiB  # host prompt cache bytes per token of a saved state
CACHING = SimulatedBehaviour(load_seconds=1.0, default_num_predict=9, state_bytes_per_token=STATE)
# A request saves the previous one's state: its 1-word prompt and 9-token answer.
SAVED = 10 * STATE


def model_size(path: Path) -> int:
    """What the scheduler predicts for a CPU load at 4,096 (flash attention on auto)."""
    return estimate(read_gguf(path), MemoryOptions(num_ctx=4096, flash_attention=None)).total


async def test_two_models_that_fit_without_their_caches_limits_both_stay(
    autojump_clock, models
) -> None:
    # Room for both models and 512 MiB more: with 2 GiB booked for each cache's limit, b
    # evicted a.
    room = model_size(models["a"]) * 2 + 512 * MiB
    async with scheduler(system_total=room, prompt_cache_mib=2048) as (sched, _, _):
        await use(sched, req(models, "a"))
        await use(sched, req(models, "b"))
        assert test_scheduler.loaded(sched) == ["a", "b"]
        infos = {info.name: info for info in sched.ps()}
        assert infos["a"].prompt_cache_limit == 2048 * MiB
        assert infos["a"].size + infos["b"].size <= room


async def test_a_cache_is_booked_as_it_grows(autojump_clock, models) -> None:
    size = model_size(models["a"])
    room = size * 2 + 512 * MiB
    async with scheduler(system_total=room, prompt_cache_mib=1024, default=CACHING) as (
        sched, engines, devices,
    ):  # fmt: skip
        await test_scheduler.generate(sched, req(models, "a"))
        model = engines.engines["a"].memory.total
        assert model == size
        slack = room - 2 * size  # what b would leave beside a's model
        saves = 0
        while saves * SAVED <= slack:
            await test_scheduler.generate(sched, req(models, "a"))
            saves += 1
            (info,) = sched.ps()
            assert info.prompt_cache == saves * SAVED
            assert info.size == model  # the cache is beside the model, not in its size
        await trio.sleep(1)
        assert (await devices.inventory()).system.free == room - model - saves * SAVED
        # b fits beside a's model, not beside a and what a's cache holds now: a goes.
        await use(sched, req(models, "b"))
        assert test_scheduler.loaded(sched) == ["b"]


async def test_the_caches_grow_only_into_memory_nobody_booked(autojump_clock, models) -> None:
    room = model_size(models["a"]) * 2 + 256 * MiB
    async with scheduler(system_total=room, prompt_cache_mib=1024, default=CACHING) as (
        sched, engines, devices,
    ):  # fmt: skip
        await use(sched, req(models, "a"))
        await trio.sleep(1)
        assert engines.engines["a"].prompt_cache.granted == 1024 * MiB  # alone: its limit
        await use(sched, req(models, "b"))
        await trio.sleep(1)
        # b took the room a's cache might have grown into: the 256 MiB left are shared.
        assert engines.engines["a"].prompt_cache.granted == 128 * MiB
        assert engines.engines["b"].prompt_cache.granted == 128 * MiB
        for _ in range(4):  # a burst on each: no save past the grant
            await test_scheduler.generate(sched, req(models, "a"))
            await test_scheduler.generate(sched, req(models, "b"))
            for name in ("a", "b"):
                assert engines.engines[name].prompt_cache.held <= 128 * MiB
            assert (await devices.inventory()).system.free >= 0
        assert test_scheduler.loaded(sched) == ["a", "b"]
        # A save that would pass the grant made llama.cpp lower its limit and drop states.
        assert engines.engines["a"].prompt_cache.limit < 128 * MiB
        sched.unload(str(models["b"]))
        await trio.sleep(5)
        assert test_scheduler.loaded(sched) == ["a"]
        cache = engines.engines["a"].prompt_cache
        assert cache.granted == cache.limit  # b's room is the cache's again, to its limit


# -- what the API reports ------------------------------------------------------------------

REUSE = SimulatedBehaviour(
    load_seconds=0.01, tokens_per_second=2000, reuse_prompt=True, state_bytes_per_token=MiB
)
HISTORY = [{"role": "user", "content": "one two three four five six seven eight nine ten"}]


async def test_usage_fields_tell_reused_from_evaluated_tokens(api_server) -> None:
    options = {"num_predict": 2}
    async with (
        api_server(behaviour=REUSE, prompt_cache_mib=32) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=10) as c,
    ):
        with trio.fail_after(30):
            body = {"model": "tiny", "stream": False, "messages": HISTORY, "options": options}
            cold = (await c.post("/api/chat", json=body)).json()
            warm = (await c.post("/api/chat", json=body)).json()
            v1 = (await c.post("/v1/chat/completions", json={
                "model": "tiny", "messages": HISTORY, "max_tokens": 2})).json()  # fmt: skip
            resp = (await c.post("/v1/responses", json={
                "model": "tiny", "input": HISTORY, "max_output_tokens": 2})).json()  # fmt: skip
            anthropic = (await c.post("/v1/messages", json={
                "model": "tiny", "messages": HISTORY, "max_tokens": 2})).json()  # fmt: skip
            ps = (await c.get("/api/ps")).json()["models"]
            samples = await scrape(c)

    assert (cold["prompt_eval_count"], cold["prompt_cached_count"]) == (10, 0)
    # The whole prompt, as Ollama counts it; all but its last token reused.
    assert (warm["prompt_eval_count"], warm["prompt_cached_count"]) == (10, 9)
    assert warm["prompt_eval_duration"] < cold["prompt_eval_duration"]
    assert v1["usage"]["prompt_tokens"] == 10
    assert v1["usage"]["prompt_tokens_details"] == {"cached_tokens": 9}
    assert resp["usage"]["input_tokens"] == 10
    assert resp["usage"]["input_tokens_details"] == {"cached_tokens": 9}
    assert anthropic["usage"]["input_tokens"] == 1  # Anthropic: only the evaluated part
    assert anthropic["usage"]["cache_read_input_tokens"] == 9

    # Each request saved the previous one's state (10 prompt words, 2 answer tokens: 12 MiB),
    # the oldest evicted to stay within the 32 MiB limit: two are held.
    (model,) = ps
    assert model["prompt_cache"] == 24 * MiB
    labels = {"model": "tiny:latest"}
    assert value(samples, "ollamatrio_prompt_cache_bytes", **labels) == 24 * MiB
    assert value(samples, "ollamatrio_prompt_cache_limit_bytes", **labels) == 32 * MiB
    assert value(samples, "ollamatrio_prompt_tokens_total", **labels) == 10 + 4 * 1
    assert value(samples, "ollamatrio_prompt_tokens_reused_total", **labels) == 4 * 9


# -- the runner ---------------------------------------------------------------------------


@pytest.mark.parametrize("mib", [0, 123])
def test_the_runner_passes_the_limit_to_llama_cpp(mib: int) -> None:
    from ollamatrio.runner.llama import build_params
    from ollamatrio.runner.options import ModelFacts, RunnerConfig, plan_load

    spec = LoadSpec(model_path="m.gguf", name="m", prompt_cache_mib=mib)
    config = RunnerConfig(spec=RunnerConfig.from_json(
        RunnerConfig(spec=spec, api_key="k", socket_dir="/tmp").to_json()).spec,
        api_key="k", socket_dir="/tmp")  # fmt: skip
    params = build_params(config, plan_load(config.spec, ModelFacts()))
    # Never llama.cpp's own default of 8 GiB, which no placement counted.
    assert params.cache_ram_mib == mib
