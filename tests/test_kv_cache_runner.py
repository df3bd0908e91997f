"""KV cache types per model and per side, with real runner processes: SmolLM2 loads with a
q8_0 K cache beside an f16 V cache and answers; a V cache llama.cpp would refuse falls back
to f16 for that model alone (one warning line), while another model keeps its types."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import trio

from ollamatrio.config import Settings
from ollamatrio.devices import SimulatedDevices
from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.model_config import parse_model_config
from ollamatrio.scheduler import ModelRequest, open_scheduler
from ollamatrio.types import CompletionRequest

TIMEOUT = 180
PROMPT = "The capital of France is"


def cpu_only() -> SimulatedDevices:
    return SimulatedDevices('{"gpus": [], "system": {"total": "16GiB"}}')


async def answer(lease) -> str:  # type: ignore[no-untyped-def]
    request = CompletionRequest(prompt=PROMPT, options={"num_predict": 8, "temperature": 0})
    async with lease.engine.complete(request) as chunks:
        return "".join([c.content async for c in chunks])


def plan_of(lease):  # type: ignore[no-untyped-def]
    plan = lease.engine.ready.plan
    return (plan.kv_cache_type_k, plan.kv_cache_type_v), plan.warnings


async def test_smollm2_with_a_q8_0_k_cache_and_an_f16_v_cache(smollm2_path: Path) -> None:
    config = parse_model_config(
        '[models.smol]\nkv_cache_type_k = "q8_0"\nkv_cache_type_v = "f16"\n', Path("m.toml")
    )
    settings = Settings()
    with trio.fail_after(TIMEOUT):
        async with open_scheduler(
            settings, engines=ProcessEngineFactory(settings), devices=cpu_only(), models=config
        ) as sched:
            async with sched.lease(
                ModelRequest(name="smol", model_path=str(smollm2_path))
            ) as lease:
                assert plan_of(lease) == (("q8_0", "f16"), ())
                assert "Paris" in await answer(lease)


async def test_a_quantized_v_cache_with_flash_attention(smollm2_path: Path) -> None:
    config = parse_model_config('[models.smol]\nkv_cache_type = "q8_0"\n', Path("m.toml"))
    settings = replace(Settings(), flash_attention=True)
    with trio.fail_after(TIMEOUT):
        async with open_scheduler(
            settings, engines=ProcessEngineFactory(settings), devices=cpu_only(), models=config
        ) as sched:
            async with sched.lease(
                ModelRequest(name="smol", model_path=str(smollm2_path))
            ) as lease:
                assert plan_of(lease) == (("q8_0", "q8_0"), ())
                assert "Paris" in await answer(lease)


async def test_a_refused_v_cache_falls_back_for_that_model_alone(
    smollm2_path: Path, tiny_gguf
) -> None:  # type: ignore[no-untyped-def]
    """Without flash attention llama.cpp refuses a quantized V cache: SmolLM2 loads with
    f16 there (its K cache stays q8_0) and says so once; the other model, loaded beside it,
    keeps the q8_0 K cache it was configured with."""
    other = tiny_gguf(embd=128, heads=2, ff=256)  # head size 64: q8_0 blocks fit
    config = parse_model_config(
        '[models.smol]\nkv_cache_type = "q8_0"\n[models.other]\nkv_cache_type_k = "q8_0"\n',
        Path("m.toml"),
    )
    settings = Settings()  # flash attention: auto
    with trio.fail_after(TIMEOUT):
        async with open_scheduler(
            settings, engines=ProcessEngineFactory(settings), devices=cpu_only(), models=config
        ) as sched:
            smol = ModelRequest(name="smol", model_path=str(smollm2_path))
            async with sched.lease(smol) as lease:
                (kv, warnings) = plan_of(lease)
                assert kv == ("q8_0", "f16")
                assert warnings == (
                    "kv cache type q8_0 unusable: a quantized V cache (q8_0) needs flash "
                    "attention; using K q8_0, V f16",
                )
                assert "Paris" in await answer(lease)
            async with sched.lease(ModelRequest(name="other", model_path=str(other))) as lease:
                assert plan_of(lease) == (("q8_0", "f16"), ())
                assert await answer(lease) is not None
            assert sorted(info.name for info in sched.ps()) == ["other", "smol"]
