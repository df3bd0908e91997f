"""The on-disk prompt cache with real runners: states saved as runners unload, restored
into the next runner of the same model and options, and nowhere else.

Tokens evaluated are the runner's own count (llama.cpp's ``prompt_tokens_total`` on a
fresh runner), not the API's ``prompt_eval_count``, whose meaning is the dialects' to set.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from ollamatrio.engines.process import ProcessEngine, ProcessEngineFactory
from ollamatrio.engines.runner_http import RunnerHttp
from ollamatrio.errors import RunnerCrashedError
from ollamatrio.slot_cache import SlotCache
from ollamatrio.types import CompletionRequest, LoadSpec, Message

TinyGGUF = Callable[..., Path]
TIMEOUT = 300  # several runner loads and prompts of hundreds of tokens on a busy CPU
OPTIONS = {"num_predict": 2, "temperature": 0}


def conversation(turns: int, rules: int = 40) -> list[Message]:
    system = " ".join(f"Rule {i}: answer briefly." for i in range(rules))
    messages = [Message("system", system), Message("user", "Hello there.")]
    for turn in range(1, turns):
        messages += [Message("assistant", "Hi."), Message("user", f"Question {turn}?")]
    return messages


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the runner's metrics")


async def ask(engine: ProcessEngine, messages: list[Message]) -> int:
    """Run one chat on a fresh runner; the prompt tokens it evaluated."""
    request = CompletionRequest(messages=messages, options=OPTIONS)
    async with engine.complete(request) as stream:
        async for _ in stream:
            pass
    return int(metric(await engine.metrics(), "llamacpp:prompt_tokens_total"))


async def ask_raw(engine: ProcessEngine, prompt: str) -> int:
    """Run one raw prompt on a fresh runner; the prompt tokens it evaluated."""
    async with engine.complete(CompletionRequest(prompt=prompt, options=OPTIONS)) as stream:
        async for _ in stream:
            pass
    return int(metric(await engine.metrics(), "llamacpp:prompt_tokens_total"))


class CountingCache(SlotCache):
    """The prompt cache, counting its index lookups."""

    finds = 0

    def find(self, *args: Any, **kwargs: Any) -> Any:
        self.finds += 1
        return super().find(*args, **kwargs)


@pytest.fixture
def cache(tmp_path: Path) -> SlotCache:
    return SlotCache(tmp_path / "prompt-cache", 1 << 30)


@pytest.fixture
def tiny_spec(tiny_gguf: TinyGGUF) -> LoadSpec:
    return LoadSpec(model_path=str(tiny_gguf()), name="tiny", num_ctx=2048)


async def test_an_unloaded_conversation_is_restored_and_deleting_the_model_forgets_it(
    api_server: Any, smollm2_path: Path, tmp_path: Path
) -> None:
    # The folder the server's settings name, so that /api/delete finds the same cache.
    cache = SlotCache(tmp_path / "ollamatrio" / "prompt-cache", 1 << 30)
    engines = ProcessEngineFactory(slot_cache=cache, load_timeout=120)
    models = {"smol": smollm2_path}

    def body(messages: list[Message], keep_alive: Any) -> dict[str, Any]:
        return {
            "model": "smol",
            "messages": [m.to_ollama() for m in messages],
            "stream": False,
            "keep_alive": keep_alive,
            "options": {**OPTIONS, "num_ctx": 2048},
        }

    with trio.fail_after(TIMEOUT):
        async with (
            api_server(engines=engines, models=models) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=None) as client,
        ):
            answer = await client.post("/api/chat", json=body(conversation(1), 0))
            assert answer.status_code == 200, answer.text
            await srv.scheduler.wait_idle()  # keep_alive 0: unloaded, its slot saved
            assert cache.usage()[0] == 1
            assert {p.name for p in cache.folder.iterdir()} <= {
                *(p.name for p in cache.folder.glob("*.bin")),
                "index.sqlite3",
            }

            answer = await client.post("/api/chat", json=body(conversation(2), "5m"))
            assert answer.status_code == 200, answer.text
            (runner,) = srv.scheduler.runners()
            assert runner.engine is not None
            runner_metrics = await runner.engine.metrics()
            evaluated = metric(runner_metrics, "llamacpp:prompt_tokens_total")
            reused = metric(runner_metrics, "llamacpp:prompt_tokens_cached_total")
            assert reused >= 300
            assert evaluated <= 0.1 * (evaluated + reused)

            deleted = await client.request("DELETE", "/api/delete", json={"model": "smol"})
            assert deleted.status_code == 200
            assert cache.usage() == (0, 0)
        # The runner unloaded after its model was deleted: nothing of it is kept.
        assert cache.usage() == (0, 0)


async def test_without_the_cache_the_prompt_is_evaluated_again(tiny_spec: LoadSpec) -> None:
    factory = ProcessEngineFactory(load_timeout=60)
    with trio.fail_after(TIMEOUT):
        async with factory.open(tiny_spec) as engine:
            first = await ask(engine, conversation(1))
        async with factory.open(tiny_spec) as engine:
            again = await ask(engine, conversation(2))
    assert again > first > 300


async def test_a_prompt_that_begins_no_saved_state_costs_no_lookup(
    tmp_path: Path, tiny_spec: LoadSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With states saved, a long prompt that none of them begins is sent as it is: no
    tokenize round trip, no index lookup (before, every such request paid both), while a
    prompt that continues a saved one is still restored (into the second slot: the first
    holds the other story)."""
    spec = replace(tiny_spec, num_parallel=2)
    cache = CountingCache(tmp_path / "prompt-cache", 1 << 30)
    factory = ProcessEngineFactory(slot_cache=cache, load_timeout=60)
    saved = " ".join(f"Rule {i}: answer briefly." for i in range(40))
    other = " ".join(f"Line {i} of another story." for i in range(40))
    paths: list[str] = []
    request = RunnerHttp.request

    async def counted(self: RunnerHttp, method: str, path: str, *args: Any) -> Any:
        paths.append(path)
        return await request(self, method, path, *args)

    monkeypatch.setattr(RunnerHttp, "request", counted)
    with trio.fail_after(TIMEOUT):
        async with factory.open(spec) as engine:
            first = await ask_raw(engine, saved)
        assert first > 300
        assert cache.usage()[0] == 1
        async with factory.open(spec) as engine:
            paths.clear()
            for _ in range(3):
                before = await ask_raw(engine, other)
            assert before > 300  # evaluated, from scratch
            assert "/tokenize" not in paths
            assert cache.finds == 0
            after = await ask_raw(engine, saved + " And one more.")
            assert after - before < 0.1 * first  # restored: only the new words evaluated
            assert cache.finds == 1


async def test_a_state_is_restored_only_for_its_own_model_and_options(
    cache: SlotCache, tiny_spec: LoadSpec, tmp_path: Path
) -> None:
    factory = ProcessEngineFactory(slot_cache=cache, load_timeout=60)
    # The same weights under another file name: another model as far as the cache knows.
    twin = tmp_path / "twin.gguf"
    os.link(tiny_spec.model_path, twin)
    others = [
        LoadSpec(model_path=tiny_spec.model_path, name="tiny", num_ctx=1024),
        LoadSpec(model_path=str(twin), name="twin", num_ctx=2048),
    ]
    with trio.fail_after(TIMEOUT):
        async with factory.open(tiny_spec) as engine:
            first = await ask(engine, conversation(1))
        assert cache.usage()[0] == 1
        for spec in others:
            async with factory.open(spec) as engine:
                assert await ask(engine, conversation(2)) > 0.5 * first  # from scratch
        async with factory.open(tiny_spec) as engine:
            assert await ask(engine, conversation(2)) < 0.1 * first


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
async def test_a_damaged_state_is_dropped_and_the_prompt_evaluated(
    cache: SlotCache, tiny_spec: LoadSpec, damage: str
) -> None:
    factory = ProcessEngineFactory(slot_cache=cache, load_timeout=60)
    with trio.fail_after(TIMEOUT):
        async with factory.open(tiny_spec) as engine:
            first = await ask(engine, conversation(1))
        (state,) = cache.folder.glob("*.bin")
        data = bytearray(state.read_bytes())
        if damage == "truncated":
            del data[len(data) // 2 :]
        else:  # the same size, but the KV header after the tokens is garbage
            tokens_end = 12 + 4 * int.from_bytes(data[8:12], "little")
            data[tokens_end : tokens_end + 64] = b"\xff" * 64
        state.write_bytes(data)
        async with factory.open(tiny_spec) as engine:
            assert await ask(engine, conversation(2)) > first  # answered, from scratch
            assert not state.exists()
            assert cache.usage()[0] == 0


async def test_a_crashed_runner_saves_nothing(cache: SlotCache, tiny_spec: LoadSpec) -> None:
    factory = ProcessEngineFactory(slot_cache=cache, load_timeout=60)
    with trio.fail_after(TIMEOUT), pytest.raises(RunnerCrashedError):
        async with factory.open(tiny_spec) as engine:
            await ask(engine, conversation(1))
            assert engine.pid is not None
            os.kill(engine.pid, signal.SIGKILL)
            await trio.sleep_forever()  # the crash cancels this
    assert cache.usage() == (0, 0)
    assert list(cache.folder.iterdir()) == []


async def test_a_cancelled_owner_still_saves_before_the_runner_stops(
    cache: SlotCache, tiny_spec: LoadSpec
) -> None:
    """Evictions and shutdown unload by cancelling the engine's owner.  That cancellation
    must not reach the runner before the save does: the runner is stopped only after it."""
    factory = ProcessEngineFactory(slot_cache=cache, load_timeout=60)
    with trio.fail_after(TIMEOUT):
        with trio.CancelScope() as owner:
            async with factory.open(tiny_spec) as engine:
                await ask(engine, conversation(1))
                pid = engine.pid
                owner.cancel()
                await trio.sleep_forever()
        assert owner.cancelled_caught
        assert cache.usage()[0] == 1
        assert pid is not None
        assert not await trio.to_thread.run_sync(_running, pid)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
