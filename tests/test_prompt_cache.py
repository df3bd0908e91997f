"""The host-RAM prompt cache: its limit (config file, OLLAMATRIO_PROMPT_CACHE, derived from
the context and the free RAM), counted by placement as host memory, handed to the runner,
shown in /api/ps and /metrics; and every dialect's usage fields telling the reused part of
a prompt from the evaluated part (on the simulated engine, which reuses a shared prefix as
llama.cpp does when asked to)."""

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
from ollamatrio.errors import InsufficientMemoryError
from ollamatrio.gguf import read_gguf
from ollamatrio.memory import MemoryOptions, estimate, plan_layout
from ollamatrio.model_config import parse_model_config
from ollamatrio.scheduler.placement import choose_placement
from ollamatrio.scheduler.prompt_cache import FREE_RAM_SHARE, STATES, MiB, prompt_cache_bytes
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


def test_the_cache_is_host_memory_in_every_layout(models: dict[str, Path]) -> None:
    plain = estimate(read_gguf(models["a"]), MemoryOptions(num_ctx=4096))
    cached = plain.__class__(**{**_fields(plain), "prompt_cache": 300 * MiB})
    assert cached.total == plain.total + 300 * MiB
    for gpus in ([], [("sim0", 80 * GiB)], [("sim0", plain.total // 3)]):
        with_cache, without = plan_layout(cached, gpus), plan_layout(plain, gpus)
        assert with_cache.host_bytes == without.host_bytes + 300 * MiB
        assert with_cache.vram_by_gpu == without.vram_by_gpu
    placement = choose_placement(cached, [], cached.total)
    assert placement is not None
    assert placement.prompt_cache == 300 * MiB
    assert choose_placement(cached, [], cached.total - 1) is None  # the cache must fit too


def _fields(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}


async def test_the_runner_gets_the_limit_and_ps_counts_it(autojump_clock, models) -> None:
    config = parse_model_config('[models.b]\nprompt_cache = 0\n[models.c]\nprompt_cache = 96\n',
                                Path("t.toml"))  # fmt: skip
    async with scheduler(prompt_cache_mib=64, config=config) as (sched, _, _):
        for name in ("a", "b", "c"):
            await use(sched, req(models, name))
        runners = {r.name: r for r in sched.runners()}
        infos = {info.name: info for info in sched.ps()}
    for name, mib in (("a", 64), ("b", 0), ("c", 96)):
        assert runners[name].spec.prompt_cache_mib == mib
        assert infos[name].prompt_cache == mib * MiB
        # What the runner measured at load (its cache still empty) plus the cache's limit.
        assert infos[name].size == runners[name].engine.memory.total + mib * MiB


async def test_a_cache_that_does_not_fit_beside_the_model_fails_the_load(
    autojump_clock, models
) -> None:
    size = test_scheduler.predicted_total(models["a"])
    room = size + 512 * MiB
    async with scheduler(system_total=room, prompt_cache_mib=256) as (sched, _, _):
        await use(sched, req(models, "a"))  # fits with its cache
    async with scheduler(system_total=room, prompt_cache_mib=1024) as (sched, _, _):
        with pytest.raises(InsufficientMemoryError):
            await use(sched, req(models, "a"))


# -- what the API reports ------------------------------------------------------------------

REUSE = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=2000, reuse_prompt=True)
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

    (model,) = ps
    assert model["prompt_cache"] == 32 * MiB
    labels = {"model": "tiny:latest"}
    assert value(samples, "ollamatrio_prompt_cache_bytes", **labels) == 32 * MiB
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
