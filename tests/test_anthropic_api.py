"""``/v1/messages`` and ``/v1/messages/count_tokens`` on a live server, through the official
``anthropic`` SDK (``messages.create``, ``messages.stream``, ``messages.count_tokens``) and
raw httpx for the wire; the simulated engine behind the scheduler, a recording engine at
the seam for what the model is given, and SmolLM2 in a real runner."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
import trio
from helpers.scripted import ScriptedEngines, weather_call

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.errors import QueueFullError
from ollamatrio.generation.requests import Message, ToolCall
from ollamatrio.testing.tiny_gguf import CHATML

# A template that advertises tools, so the model gets the capability.
TOOLS_TEMPLATE = CHATML + "{% if tools %}{{ tools }}{% endif %}"
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
HI = [{"role": "user", "content": "hi there"}]
PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a")).decode()

# The SDK may stop reading a stream without closing its inner async generators; under Trio
# their finalizer warns (as the OpenAI tests allow for the same reason).
pytestmark = [
    pytest.mark.filterwarnings(f"ignore:Async generator '{module}\\.:ResourceWarning")
    for module in ("anthropic", "httpx", "httpcore")
]


@asynccontextmanager
async def sdk(url: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=url, api_key="ollama", max_retries=0) as c:
        yield c


async def test_create(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            # The simulated engine writes max_tokens tokens: it stops only at the limit.
            message = await c.messages.create(model="tiny", max_tokens=16, messages=HI)
            assert message.id.startswith("msg_")
            assert (message.type, message.role, message.model) == ("message", "assistant", "tiny")
            (block,) = message.content
            assert block.type == "text"
            assert block.text.strip()
            assert message.stop_reason == "max_tokens"
            assert message.stop_sequence is None
            assert message.usage.output_tokens == 16
            assert message.usage.input_tokens == 2  # the simulated engine's words
            short = await c.messages.create(model="tiny", max_tokens=3, messages=HI)
            assert short.usage.output_tokens == 3


async def test_stream_through_the_sdk_helper(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            async with c.messages.stream(
                model="tiny", max_tokens=4, messages=HI,
                system=[{"type": "text", "text": "be brief",
                         "cache_control": {"type": "ephemeral"}}],
            ) as stream:  # fmt: skip
                texts = [text async for text in stream.text_stream]
                final = await stream.get_final_message()
            assert len(texts) == 4
            (block,) = final.content
            assert block.type == "text"
            assert block.text == "".join(texts)
            assert final.stop_reason == "max_tokens"
            assert (final.usage.input_tokens, final.usage.output_tokens) == (4, 4)


async def test_count_tokens_is_what_a_generation_is_given(api_server) -> None:
    """The count is the prompt a generation of the same request evaluates."""
    body: dict[str, Any] = {
        "model": "tiny", "system": "answer in one word",
        "messages": [{"role": "user", "content": "what colour is the sky"}],
    }  # fmt: skip
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            counted = await c.messages.count_tokens(**body)
            message = await c.messages.create(max_tokens=2, **body)
            assert counted.input_tokens == message.usage.input_tokens == 9
            longer = await c.messages.count_tokens(
                model="tiny", messages=[{"role": "user", "content": "one two three four five"}]
            )
            assert longer.input_tokens == 5


async def test_tool_use_round_trip(api_server, tiny_gguf) -> None:
    """A tool offer answered with thinking, text and a tool_use block (whole and streamed),
    then the tool_result history as the engine is given it."""
    engines = ScriptedEngines(partial(weather_call, content="Let me look.", call_id="toolu_x"))
    model = tiny_gguf(chat_template=TOOLS_TEMPLATE)
    with trio.fail_after(20):
        async with api_server(engines=engines, models={"helper": model}) as srv, sdk(srv.url) as c:
            ask = [{"role": "user", "content": "weather in Paris?"}]
            message = await c.messages.create(
                model="helper", max_tokens=64, messages=ask, tools=[WEATHER]
            )
            assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
            use = message.content[2]
            assert use.type == "tool_use"
            assert (use.id, use.name, use.input) == ("toolu_x", "get_weather", {"city": "Paris"})
            assert message.stop_reason == "tool_use"
            async with c.messages.stream(
                model="helper", max_tokens=64, messages=ask, tools=[WEATHER]
            ) as stream:
                final = await stream.get_final_message()
            assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
            assert final.content[0].type == "thinking"
            assert final.content[0].thinking == "the user wants the weather"
            assert final.content[2].type == "tool_use"
            assert final.content[2].input == {"city": "Paris"}
            assert final.stop_reason == "tool_use"
            history = [
                *ask,
                {"role": "assistant", "content": [b.model_dump() for b in message.content]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_x", "content": "sunny"}]},
            ]  # fmt: skip
            await c.messages.create(model="helper", max_tokens=8, messages=history, tools=[WEATHER])
    first, _, third = engines.requests
    assert first.tools == [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                          "parameters": WEATHER["input_schema"]}}
    ]  # fmt: skip
    assert list(third.messages or ()) == [
        Message("user", "weather in Paris?"),
        Message(
            "assistant", "Let me look.", thinking="the user wants the weather",
            tool_calls=(ToolCall("get_weather", {"city": "Paris"}, "toolu_x"),),
        ),
        Message("tool", "sunny", tool_name="get_weather", tool_call_id="toolu_x"),
    ]  # fmt: skip


async def test_claude_code_request_with_beta_query(api_server) -> None:
    """What Claude Code sends: ``?beta=true``, its headers, extra fields, always streamed."""
    headers = {
        "Authorization": "Bearer ollama", "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14", "x-app": "cli",
    }  # fmt: skip
    body = {
        "model": "tiny", "max_tokens": 16, "stream": True,
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control":
                                          {"type": "ephemeral"}}]},
            {"role": "system", "content": [{"type": "text", "text": "cwd: /tmp"}]},
        ],
        "metadata": {"user_id": json.dumps({"session_id": "s"})},
        "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
        "context_management": {"edits": []},
    }  # fmt: skip
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/v1/messages?beta=true", json=body, headers=headers)
            assert r.status_code == 200, r.text
            assert r.headers["content-type"].startswith("text/event-stream")
            kinds = [line[7:] for line in r.text.split("\n") if line.startswith("event: ")]
            assert kinds[:2] == ["message_start", "ping"]
            assert kinds[-2:] == ["message_delta", "message_stop"]
            assert kinds.count("content_block_delta") == 16


def image_turn(data: str) -> list[dict[str, Any]]:
    """One user turn holding one base64 PNG image block."""
    source = {"type": "base64", "media_type": "image/png", "data": data}
    return [{"role": "user", "content": [{"type": "image", "source": source}]}]


@pytest.mark.parametrize(
    ("body", "status", "kind"),
    [
        ({"model": "tiny", "messages": HI}, 400, "invalid_request_error"),
        ({"model": "nope", "max_tokens": 8, "messages": HI}, 404, "not_found_error"),
        ({"model": "tiny-embed", "max_tokens": 8, "messages": HI}, 400, "invalid_request_error"),
        # An image for a model without a projector; a broken image.
        (
            {"model": "tiny", "max_tokens": 8, "messages": image_turn(PNG)},
            400,
            "invalid_request_error",
        ),
        (
            {"model": "tiny", "max_tokens": 8, "messages": image_turn("%%%")},
            400,
            "invalid_request_error",
        ),
    ],
)
async def test_errors_in_anthropic_shape(
    api_server, body: dict[str, Any], status: int, kind: str
) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            for path in ("/v1/messages", "/v1/messages?beta=true", "/v1/messages/count_tokens"):
                if path.endswith("count_tokens") and "max_tokens" not in body:
                    continue  # count_tokens needs no max_tokens
                r = await c.post(path, json=body)
                assert r.status_code == status, r.text
                error = r.json()
                assert error["type"] == "error"
                assert error["error"]["type"] == kind
                assert error["error"]["message"]
                if "%%%" in json.dumps(body):
                    assert "invalid base64 image data" in error["error"]["message"]
                elif "image" in json.dumps(body):
                    assert "vision" in error["error"]["message"]


async def test_bad_json_and_sdk_errors(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                r = await c.post("/v1/messages", content=b"{not json")
                assert r.status_code == 400
                assert r.json()["error"]["type"] == "invalid_request_error"
            async with sdk(srv.url) as c:
                with pytest.raises(anthropic.NotFoundError) as caught:
                    await c.messages.create(model="nope", max_tokens=8, messages=HI)
                body = caught.value.body
                assert isinstance(body, dict)
                assert body.pop("request_id").startswith("req_")
                assert body == {
                    "type": "error",
                    "error": {"type": "not_found_error", "message": "model 'nope' not found"},
                }


async def test_full_queue_is_overloaded_with_retry_after(api_server) -> None:
    with trio.fail_after(20):
        async with api_server(max_queue=0) as srv:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                for path in ("/v1/messages", "/v1/messages/count_tokens"):
                    r = await c.post(path, json={"model": "tiny", "max_tokens": 8, "messages": HI})
                    assert r.status_code == 503
                    assert r.headers["retry-after"] == "1"
                    body = r.json()
                    assert len(body.pop("request_id")) == len("req_") + 24
                    assert body == {
                        "type": "error",
                        "error": {"type": "overloaded_error", "message": QueueFullError.MESSAGE},
                    }
            async with sdk(srv.url) as c:
                with pytest.raises(anthropic.InternalServerError) as caught:
                    await c.messages.create(model="tiny", max_tokens=8, messages=HI)
                assert caught.value.status_code == 503


@pytest.mark.slow
async def test_smollm2_through_the_anthropic_sdk(api_server, smollm2_path: Path) -> None:
    """A real runner: the answer, the stream, and count_tokens by the model's own template
    and tokenizer equal to the prompt the runner evaluated."""
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    with trio.fail_after(240):
        async with (
            api_server(
                engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path}
            ) as srv,
            sdk(srv.url) as c,
        ):
            message = await c.messages.create(
                model="smol", max_tokens=24, system="Answer briefly.", messages=messages,
                extra_body={"temperature": 0},
            )  # fmt: skip
            assert message.content[0].type == "text"
            assert "France" in message.content[0].text  # a 135M model: not always right
            assert message.stop_reason == "end_turn"
            counted = await c.messages.count_tokens(
                model="smol", system="Answer briefly.", messages=messages
            )
            # The whole prompt: the part evaluated and the part reused from the cache.
            usage = message.usage
            assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
            assert counted.input_tokens > 10
            async with c.messages.stream(
                model="smol", max_tokens=8, messages=messages, extra_body={"temperature": 0}
            ) as stream:
                texts = [text async for text in stream.text_stream]
                final = await stream.get_final_message()
            assert "".join(texts).strip()
            assert 0 < final.usage.output_tokens <= 8
            assert final.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.slow
async def test_smollm2_stops_on_a_stop_sequence(api_server, smollm2_path: Path) -> None:
    """A real runner stopped by one of ``stop_sequences``: ``stop_reason`` names it, and
    ``stop_sequence`` says which, in the one-piece message and in the stream's
    ``message_delta``; the text ends before the sequence."""
    messages = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    ask: dict[str, Any] = {
        "model": "smol", "max_tokens": 40, "messages": messages,
        "stop_sequences": ["never said", "5"], "extra_body": {"temperature": 0},
    }  # fmt: skip
    with trio.fail_after(240):
        async with (
            api_server(
                engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path}
            ) as srv,
            sdk(srv.url) as c,
        ):
            message = await c.messages.create(**ask)
            assert message.content[0].type == "text"
            text = message.content[0].text
            assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "5")
            assert "4" in text
            assert "5" not in text
            assert 0 < message.usage.output_tokens < 40
            async with c.messages.stream(**ask) as stream:
                streamed = "".join([piece async for piece in stream.text_stream])
                final = await stream.get_final_message()
            assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "5")
            assert streamed == text
            assert final.usage.output_tokens == message.usage.output_tokens
