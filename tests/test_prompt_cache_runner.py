"""llama.cpp's prompt reuse with real runners (SmolLM2 on the CPU): two agent-shaped
conversations alternating on one slot keep their prefixes in the host-RAM prompt cache, a
title request between their turns does not push them out, and with two slots each
conversation keeps its own slot (llama.cpp picks the slot by longest common prefix); and a
cache capped below its limit by the scheduler's grant skips saves and keeps serving.

Each conversation's system prompt is ~1,400 tokens; "re-evaluates ≤ 5 %" is read from the
final chunk's counts (``prompt_eval_count`` the whole prompt, ``prompt_cached_count`` the
part reused).  The control runs the same alternation with the cache off.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ollamatrio.engines import cache_allowance
from ollamatrio.engines.cache_allowance import MiB
from ollamatrio.engines.process import ProcessEngine, ProcessEngineFactory
from ollamatrio.testing.agent_prompts import Conversation, title_request
from ollamatrio.types import Chunk, CompletionRequest, LoadSpec, Message

pytestmark = pytest.mark.slow

LINES = 60  # ~1,400 tokens of system prompt per conversation
OPTIONS = {"temperature": 0, "seed": 1, "num_predict": 8}
REUSED_SHARE = 0.95  # from the second turn on, at most 5 % of a prompt is evaluated


def spec(model: Path, *, slots: int, cache_mib: int) -> LoadSpec:
    return LoadSpec(
        model_path=str(model),
        name="smollm2",
        num_ctx=4096,
        num_parallel=slots,
        prompt_cache_mib=cache_mib,
    )


async def ask(engine: ProcessEngine, messages: list[Message]) -> tuple[str, Chunk]:
    text, final = "", Chunk()
    with trio.fail_after(600):
        async with engine.complete(CompletionRequest(messages=messages, options=OPTIONS)) as s:
            async for chunk in s:
                text += chunk.content
                if chunk.done:
                    final = chunk
    assert final.done
    return text, final


async def turn(engine: ProcessEngine, conversation: Conversation, n: int) -> Chunk:
    text, final = await ask(engine, conversation.ask(n))
    conversation.answered(text)
    return final


def evaluated(final: Chunk) -> int:
    return final.prompt_eval_count - final.prompt_cached_count


def assert_reused(final: Chunk) -> None:
    assert final.prompt_cached_count >= REUSED_SHARE * final.prompt_eval_count, (
        f"{evaluated(final)} of {final.prompt_eval_count} prompt tokens evaluated"
    )


async def test_conversations_alternating_on_one_slot_restore_from_the_cache(
    smollm2_path: Path,
) -> None:
    a, b = Conversation("alpha", LINES), Conversation("bravo", LINES)
    async with ProcessEngineFactory().open(spec(smollm2_path, slots=1, cache_mib=256)) as engine:
        first = await turn(engine, a, 1)
        assert first.prompt_cached_count == 0
        assert first.prompt_eval_count > 1000
        await turn(engine, b, 1)  # takes A's slot: A's state goes to the RAM cache
        _, title = await ask(engine, title_request(a))  # a short side request in between
        assert title.prompt_eval_count < 100
        for n in (2, 3):
            a_turn = await turn(engine, a, n)
            b_turn = await turn(engine, b, n)
            assert_reused(a_turn)
            assert_reused(b_turn)
            # The whole prompt is counted, as Ollama counts it: it only grew.
            assert a_turn.prompt_eval_count > first.prompt_eval_count
            _, title = await ask(engine, title_request(a))


async def test_sessions_sharing_a_prefix_on_one_slot_keep_their_own_history(
    smollm2_path: Path,
) -> None:
    """Agents' sessions share their long system prompt and differ after it.  On one slot,
    each turn reuses the conversation's whole previous prompt (its history), not only the
    prefix the other session shares: llama.cpp's choice by prompt similarity would keep the
    other's state and drop this one's history unsaved (runner/llama.py prompt_similarity)."""
    a = Conversation("alpha", LINES)
    b = Conversation("bravo", LINES, messages=[a.messages[0]])  # the same system prompt
    async with ProcessEngineFactory().open(spec(smollm2_path, slots=1, cache_mib=256)) as engine:
        previous = {"a": await turn(engine, a, 1), "b": await turn(engine, b, 1)}
        assert previous["b"].prompt_cached_count > 1000  # B starts from A's system prompt
        for n in (2, 3):
            for name, conversation in (("a", a), ("b", b)):
                final = await turn(engine, conversation, n)
                assert final.prompt_cached_count >= previous[name].prompt_eval_count, (
                    f"turn {n} of {name}: {final.prompt_cached_count} reused, its previous "
                    f"prompt was {previous[name].prompt_eval_count}"
                )
                previous[name] = final


async def test_without_the_cache_a_conversation_that_lost_its_slot_starts_over(
    smollm2_path: Path,
) -> None:
    a, b = Conversation("alpha", LINES), Conversation("bravo", LINES)
    async with ProcessEngineFactory().open(spec(smollm2_path, slots=1, cache_mib=0)) as engine:
        await turn(engine, a, 1)
        await turn(engine, b, 1)
        again = await turn(engine, a, 2)
    assert evaluated(again) > 0.5 * again.prompt_eval_count


async def test_each_conversation_keeps_its_own_slot(smollm2_path: Path) -> None:
    # The cache is off: only llama.cpp's slot choice by longest common prefix is at work.
    a, b = Conversation("alpha", LINES), Conversation("bravo", LINES)
    async with ProcessEngineFactory().open(spec(smollm2_path, slots=2, cache_mib=0)) as engine:
        await turn(engine, a, 1)
        await turn(engine, b, 1)
        assert_reused(await turn(engine, a, 2))
        assert_reused(await turn(engine, b, 2))


async def test_a_cache_capped_below_its_limit_skips_saves_and_keeps_serving(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's grant caps the runner's private memory (RLIMIT_DATA): a save that
    would pass it fails inside llama.cpp, which keeps serving and drops states instead."""
    monkeypatch.setattr(cache_allowance, "HEADROOM", 16 * MiB)  # one slot needs ~1 MiB
    cap = 16 * MiB + 8 * MiB
    async with ProcessEngineFactory().open(spec(smollm2_path, slots=1, cache_mib=256)) as engine:
        engine.grant_prompt_cache(8 * MiB)
        held = []
        for n in range(6):  # each ~320-token prompt leaves a 7.1 MiB state to save
            words = " ".join(f"word{n}x{i}" for i in range(60))
            _, final = await ask(engine, [Message(role="user", content=words)])
            assert final.prompt_eval_count > 300
            held.append(engine.prompt_cache_held())
        assert await engine.healthy()
    assert max(held) >= 14 * MiB, held  # two states were saved and counted
    assert max(held) <= cap, held  # uncapped, six saves would hold 35 MiB
    assert held[-1] < max(held), held  # the save that failed made llama.cpp drop states
