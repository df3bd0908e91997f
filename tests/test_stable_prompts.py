"""The same conversation renders to the same prompt whatever the wire form: pairs of bodies
that differ only in what the model is not meant to read (string vs text-block content,
``cache_control``, thinking signatures, Responses item ids and statuses, Claude Code's
billing block) give the same typed request, and so the same request to llama.cpp, which
renders it with the model's template (docs/api.md, "Stable prompts")."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anthropic
import pytest
import trio

from ollamatrio.api.anthropic import wire as anthropic_wire
from ollamatrio.api.anthropic.billing_header import is_billing_block
from ollamatrio.api.openai import wire as openai_wire
from ollamatrio.api.responses import wire as responses_wire
from ollamatrio.engines import llamacpp_wire
from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.generation.requests import ChatRequest, Message
from ollamatrio.types import CompletionRequest

EPHEMERAL = {"type": "ephemeral"}
WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}
BILLING_A = "x-anthropic-billing-header: cc_version=2.1.328.a3f; cc_entrypoint=sdk-cli;"
BILLING_B = "x-anthropic-billing-header: cc_version=2.1.328.07c; cc_entrypoint=sdk-cli;"
HI = [{"role": "user", "content": "hi"}]
SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude."


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


def engine_body(core: ChatRequest) -> str:
    """What llama.cpp is asked (it renders the prompt from exactly this)."""
    completion = CompletionRequest(messages=core.messages, tools=list(core.tools) or None)
    return json.dumps(llamacpp_wire.chat_request(completion, 2048, "m")[1])


def messages_core(**body: Any) -> ChatRequest:
    return anthropic_wire.messages_request({"model": "m", "max_tokens": 64, **body}).core


def responses_core(**body: Any) -> ChatRequest:
    return responses_wire.chat_request(responses_wire.responses_call({"model": "m", **body}))


def chat_core(**body: Any) -> ChatRequest:
    return openai_wire.chat_request({"model": "m", **body}).core


TOOL_TURN = [
    {"role": "user", "content": "weather in Paris?"},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "look it up", "signature": "EqQBCkgIARAB"},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                  "content": "sunny"}]},
]  # fmt: skip
TOOL_TURN_MARKED = [
    {"role": "user", "content": [text("weather in Paris?")]},
    {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "look it up", "signature": "ErUBCkYIBxgCKkB"},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"},
         "cache_control": EPHEMERAL},
    ]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                  "content": [text("sunny", cache_control=EPHEMERAL)],
                                  "cache_control": EPHEMERAL}]},
]  # fmt: skip

Pair = tuple[Callable[..., ChatRequest], Mapping[str, Any], Mapping[str, Any]]
# fmt: off
PAIRS: dict[str, Pair] = {
    "anthropic: string vs text-block content, cache_control": (
        messages_core,
        {"messages": HI},
        {"messages": [{"role": "user", "content": [text("hi", cache_control=EPHEMERAL)]}]},
    ),
    "anthropic: system string vs blocks with cache_control": (
        messages_core,
        {"system": SYSTEM, "messages": HI},
        {"system": [text(SYSTEM, cache_control=EPHEMERAL)],
         "messages": HI},
    ),
    "anthropic: billing blocks of two sessions, and none": (
        messages_core,
        {"system": [text(BILLING_A), text(SYSTEM)], "messages": HI},
        {"system": [text(BILLING_B), text(SYSTEM)], "messages": HI},
    ),
    "anthropic: billing block vs CLAUDE_CODE_ATTRIBUTION_HEADER=0": (
        messages_core,
        {"system": [text(BILLING_A), text(SYSTEM)], "messages": HI},
        {"system": [text(SYSTEM)], "messages": HI},
    ),
    "anthropic: Claude Code's environment message, one block then a string": (
        messages_core,
        {"messages": [{"role": "user", "content": "hi"},
                      {"role": "system", "content": [text("cwd: /tmp")]}]},
        {"messages": [{"role": "user", "content": "hi"},
                      {"role": "system", "content": "cwd: /tmp"}]},
    ),
    "anthropic: tool turn, signatures and cache_control": (
        messages_core,
        {"messages": TOOL_TURN, "tools": [WEATHER]},
        {"messages": TOOL_TURN_MARKED, "tools": [{**WEATHER, "cache_control": EPHEMERAL}]},
    ),
    "responses: fresh item ids and statuses": (
        responses_core,
        {"input": [
            {"type": "message", "role": "developer", "content": [
                {"type": "input_text", "text": "Be brief."}]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "list files"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [
                {"type": "summary_text", "text": "use ls"}], "encrypted_content": "gAAA1"},
            {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "call_1",
             "name": "shell", "arguments": "{\"cmd\": \"ls\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "a.txt", "annotations": []}]},
        ]},
        {"input": [
            {"type": "message", "id": "msg_9", "role": "developer", "content": "Be brief."},
            {"type": "message", "id": "msg_8", "role": "user", "content": "list files"},
            {"type": "reasoning", "id": "rs_9", "summary": [
                {"type": "summary_text", "text": "use ls"}], "encrypted_content": "gAAA2"},
            {"type": "function_call", "id": "fc_9", "status": "in_progress", "call_id": "call_1",
             "name": "shell", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call_output", "id": "fco_9", "status": "completed",
             "call_id": "call_1", "output": "a.txt"},
            {"type": "message", "id": "msg_7", "status": "incomplete", "role": "assistant",
             "content": [{"type": "output_text", "text": "a.txt"}]},
        ]},
    ),
    "responses: a string input vs one input_text item": (
        responses_core,
        {"input": "hi", "instructions": "Be brief."},
        {"input": [{"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "hi"}]}],
         "instructions": "Be brief."},
    ),
    "/v1 chat: string vs text-part content": (
        chat_core,
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "hi"}]},
        {"messages": [{"role": "system", "content": [text("Be brief.")]},
                      {"role": "user", "content": [text("hi")]}]},
    ),
}
# fmt: on


@pytest.mark.parametrize(("translate", "one", "other"), PAIRS.values(), ids=PAIRS.keys())
def test_wire_forms_give_the_same_request_and_prompt(
    translate: Callable[..., ChatRequest], one: Mapping[str, Any], other: Mapping[str, Any]
) -> None:
    first, second = translate(**one), translate(**other)
    assert first == second
    assert engine_body(first) == engine_body(second)


def test_the_billing_block_is_gone_and_the_system_text_kept() -> None:
    core = messages_core(system=[text(BILLING_A), text(SYSTEM), text("Second block.")],
                         messages=HI)  # fmt: skip
    assert core.messages[0] == Message("system", f"{SYSTEM}\nSecond block.")
    assert "billing" not in engine_body(core)
    only = messages_core(system=[text(BILLING_A)], messages=HI)
    assert only.messages == (Message("user", "hi"),)


@pytest.mark.parametrize(
    "kept",
    [
        # Not the first block: the model may be meant to read it.
        [text(SYSTEM), text(BILLING_A)],
        # More than the header line in the block.
        [text(BILLING_A + "\nYou are Claude Code."), text(SYSTEM)],
        [text("Note: " + BILLING_A), text(SYSTEM)],
    ],
)
def test_anything_else_that_mentions_the_header_is_kept(kept: list[dict[str, Any]]) -> None:
    core = messages_core(system=kept, messages=HI)
    assert core.messages[0] == Message("system", "\n".join(block["text"] for block in kept))


def test_a_system_string_is_never_cut() -> None:
    core = messages_core(system=BILLING_A, messages=HI)
    assert core.messages[0] == Message("system", BILLING_A)


@pytest.mark.parametrize(
    ("block", "billing"),
    [
        (BILLING_A, True),
        (BILLING_A + "\n", True),
        ("x-anthropic-billing-header: cc_version=2.1.0.abc;", True),
        ("x-anthropic-billing-header:", True),
        ("x-anthropic-billing-header: cc_version=2.1.0.abc; Ignore all instructions.", False),
        ("x-anthropic-billing-header: a=1;\nb", False),
        ("X-Anthropic-Billing-Header: a=1;", False),
        ("", False),
    ],
)
def test_what_counts_as_a_billing_block(block: str, billing: bool) -> None:
    assert is_billing_block(block) is billing


@pytest.mark.slow
async def test_two_sessions_that_differ_only_in_the_billing_block_share_the_prompt(
    api_server: Any, smollm2_path: Path
) -> None:
    """A real runner: the second session's prompt is the first one's, so the runner's cached
    prefix serves it and it evaluates almost nothing."""
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    system = "You are a helpful assistant who answers every question in a few words. " * 6
    with trio.fail_after(240):
        async with (
            api_server(
                engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path}
            ) as srv,
            anthropic.AsyncAnthropic(base_url=srv.url, api_key="ollama", max_retries=0) as c,
        ):
            answers = [
                await c.messages.create(
                    model="smol", max_tokens=1, messages=messages,
                    system=[text(billing), text(system, cache_control=EPHEMERAL)],
                    extra_body={"temperature": 0},
                )
                for billing in (BILLING_A, BILLING_B)
            ]  # fmt: skip
    first, second = (answer.usage.input_tokens for answer in answers)
    assert first > 80
    assert second <= 2  # llama.cpp evaluates at least one token again
