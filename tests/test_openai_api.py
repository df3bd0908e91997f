"""The OpenAI-compatible ``/v1`` API on real hypercorn: the official ``openai`` SDK for what
clients see, raw httpx for the wire (SSE framing, error bodies), and the simulated engine
behind the scheduler.  Request translation is checked at the engine seam: an engine factory
that records every :class:`CompletionRequest` (and answers tool offers with a tool call,
which the simulated engine cannot do)."""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio
from helpers.scripted import ScriptedEngines

from ollamatrio.api.openai import wire
from ollamatrio.engines.simulated import (
    SimulatedBehaviour,
)
from ollamatrio.errors import InvalidRequestError, QueueFullError
from ollamatrio.generation.requests import Message, ToolCall
from ollamatrio.testing.tiny_gguf import CHATML

# A template that advertises tools and thinking, so the model gets both capabilities.
TOOLS_TEMPLATE = CHATML + "{% if tools %}{{ tools }}{% endif %}{% if enable_thinking %}{% endif %}"
PNG_1PX = base64.b64encode(bytes.fromhex("89504e470d0a1a0a")).decode()
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

# The SDK stops reading a stream at [DONE] without closing its inner async generators;
# under Trio their finalizer warns (as pyproject already allows for httpx's own).
pytestmark = [
    pytest.mark.filterwarnings(f"ignore:Async generator '{module}\\.:ResourceWarning")
    for module in ("openai", "httpx2", "httpcore2")
]


@asynccontextmanager
async def sdk(url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="ollama", max_retries=0) as c:
        yield c


def sse_events(text: str) -> list[Any]:
    """Every event must be ``data: <json>`` then a blank line; ``[DONE]`` stays a string."""
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[6:] if e == "data: [DONE]" else json.loads(e[6:]) for e in events]


async def eventually(predicate: Callable[[], bool], within: float) -> None:
    """Wait (bounded) for an effect on the server, which runs in this same Trio run."""
    with trio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 (the state lives in the server's objects)
            await trio.sleep(0.002)


# -- a recording engine at the seam ----------------------------------------------------


# -- chat ------------------------------------------------------------------------------


async def test_chat_completion(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            resp = await c.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "why is the sky blue?"}]
            )
            assert resp.id.startswith("chatcmpl-")
            assert resp.object == "chat.completion"
            assert resp.model == "tiny"
            assert resp.system_fingerprint == "fp_ollama"
            assert isinstance(resp.created, int)
            assert abs(resp.created - time.time()) < 60
            (choice,) = resp.choices
            assert choice.index == 0
            assert choice.message.role == "assistant"
            assert choice.message.content
            assert choice.message.content.strip()
            assert choice.message.tool_calls is None
            assert choice.finish_reason == "stop"
            assert resp.usage is not None
            assert resp.usage.completion_tokens == 16  # the simulated default
            assert resp.usage.prompt_tokens > 0
            assert resp.usage.total_tokens == resp.usage.prompt_tokens + 16


async def test_chat_stream_with_usage(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            chunks = [
                chunk
                async for chunk in await c.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": "hi"}],
                    stream=True,
                    stream_options={"include_usage": True},
                )
            ]
            assert len({chunk.id for chunk in chunks}) == 1
            assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
            *content, finish, usage = chunks
            assert len(content) == 16
            for chunk in content:
                assert chunk.choices[0].finish_reason is None
                assert chunk.choices[0].delta.content
                assert chunk.usage is None
            assert finish.choices[0].finish_reason == "stop"
            assert not finish.choices[0].delta.content
            assert usage.choices == []
            assert usage.usage is not None
            assert usage.usage.completion_tokens == 16


async def test_chat_sse_framing(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post(
                "/v1/chat/completions",
                json={"model": "tiny", "stream": True, "max_tokens": 3,
                      "messages": [{"role": "user", "content": "hi"}]},
            )  # fmt: skip
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r.text)
            assert events[-1] == "[DONE]"
            finish = events[-2]
            assert finish["choices"] == [
                {"index": 0, "delta": {"role": "assistant", "content": ""},
                 "finish_reason": "length"}
            ]  # fmt: skip
            assert "usage" not in finish  # only when stream_options.include_usage
            assert len(events) == 3 + 2


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_token_limit_is_num_predict(api_server, field: str) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            resp = await c.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "count"}], **{field: 3}
            )
            assert resp.choices[0].finish_reason == "length"
            assert resp.usage is not None
            assert resp.usage.completion_tokens == 3


# -- completions -----------------------------------------------------------------------


async def test_completions(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            resp = await c.completions.create(model="tiny", prompt="once upon", max_tokens=4)
            assert resp.id.startswith("cmpl-")
            assert resp.object == "text_completion"
            assert resp.model == "tiny"
            assert resp.system_fingerprint == "fp_ollama"
            (choice,) = resp.choices
            assert choice.text.strip()
            assert choice.finish_reason == "length"
            assert resp.usage is not None
            assert resp.usage.completion_tokens == 4

            chunks = [
                chunk
                async for chunk in await c.completions.create(
                    model="tiny", prompt="once upon", stream=True,
                    stream_options={"include_usage": True},
                )
            ]  # fmt: skip
            *text, finish, usage = chunks
            # The same prompt gives the same (simulated) words: 4 of them, then all 16.
            assert "".join(chunk.choices[0].text for chunk in text).startswith(choice.text)
            assert len(text) == 16
            assert all(chunk.choices[0].finish_reason is None for chunk in text)
            assert finish.choices[0].text == ""
            assert finish.choices[0].finish_reason == "stop"
            assert usage.choices == []
            assert usage.usage is not None
            assert usage.usage.completion_tokens == 16


# -- embeddings ------------------------------------------------------------------------


async def test_embeddings_float_and_base64(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            floats = await c.embeddings.create(
                model="tiny-embed", input=["hello", "world"], encoding_format="float"
            )
            assert floats.object == "list"
            assert floats.model == "tiny-embed"
            assert [d.index for d in floats.data] == [0, 1]
            assert all(d.object == "embedding" for d in floats.data)
            assert len(floats.data[0].embedding) == 64  # the tiny model's embedding length
            assert floats.usage.prompt_tokens == 2
            assert floats.usage.total_tokens == 2

            # The SDK's default asks for base64 and decodes it itself.
            default = await c.embeddings.create(model="tiny-embed", input="hello")
            assert default.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-6)

            async with httpx.AsyncClient(base_url=srv.url) as h:
                r = await h.post("/v1/embeddings", json={"model": "tiny-embed", "input": "hello",
                                                         "encoding_format": "base64"})  # fmt: skip
                packed = base64.b64decode(r.json()["data"][0]["embedding"])
                decoded = struct.unpack(f"<{len(packed) // 4}f", packed)
                assert decoded == pytest.approx(floats.data[0].embedding, abs=1e-6)

                r = await h.post("/v1/embeddings", json={"model": "tiny-embed", "input": "hello",
                                                         "dimensions": 8})  # fmt: skip
                assert len(r.json()["data"][0]["embedding"]) == 8


# -- models ----------------------------------------------------------------------------


async def test_models_list_and_retrieve(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            await trio.to_thread.run_sync(srv.store.copy, "tiny", "someone/thing:v1")
            listed = {m.id: m async for m in c.models.list()}
            assert set(listed) == {"tiny:latest", "tiny-embed:latest", "someone/thing:v1"}
            assert listed["tiny:latest"].owned_by == "library"
            assert listed["someone/thing:v1"].owned_by == "someone"
            stored = {m.short_name: m for m in srv.store.list()}
            for name, model in listed.items():
                assert model.object == "model"
                assert model.created == int(stored[name].modified_at.timestamp())

            tiny = await c.models.retrieve("tiny")
            assert (tiny.id, tiny.owned_by) == ("tiny", "library")
            thing = await c.models.retrieve("someone/thing:v1")  # ":" and "/" in the path
            assert (thing.id, thing.owned_by) == ("someone/thing:v1", "someone")
            with pytest.raises(openai.NotFoundError) as caught:
                await c.models.retrieve("missing:latest")
            assert caught.value.body == {
                "message": "model 'missing:latest' not found",
                "type": "not_found_error",
                "param": None,
                "code": None,
            }


# -- errors ----------------------------------------------------------------------------

HI = [{"role": "user", "content": "hi"}]


def image_message(url: str) -> list[dict[str, Any]]:
    parts = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    return [{"role": "user", "content": parts}]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/chat/completions", b"{not json", 400, "invalid JSON"),
        ("/v1/chat/completions", b"", 400, "missing request body"),
        ("/v1/chat/completions", {"model": "nope", "messages": HI}, 404,
         "model 'nope' not found"),
        ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400,
         "[] is too short - 'messages'"),
        ("/v1/chat/completions", {"messages": HI}, 400, "model is required"),
        ("/v1/chat/completions", {"model": "tiny", "messages": image_message(
            f"data:image/png;base64,{PNG_1PX}")}, 400, "does not support vision"),
        ("/v1/chat/completions", {"model": "tiny", "messages": image_message(
            "https://example.com/cat.png")}, 400, "invalid image input"),
        ("/v1/chat/completions", {"model": "tiny", "messages": HI, "tools": [WEATHER_TOOL]},
         400, "registry.ollama.ai/library/tiny:latest does not support tools"),
        ("/v1/chat/completions", {"model": "tiny", "messages": HI, "reasoning_effort": "high"},
         400, '"tiny" does not support thinking'),
        ("/v1/chat/completions", {"model": "tiny", "messages": HI, "reasoning_effort": "huge"},
         400, "invalid reasoning value"),
        ("/v1/chat/completions", {"model": "tiny", "messages": HI, "temperature": "hot"},
         400, "temperature must be of type float"),
        ("/v1/chat/completions", {"model": "tiny", "messages": HI, "stop": [1]},
         400, "invalid type for 'stop' field"),
        ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user"}]},
         400, "invalid message content type: null"),
        ("/v1/chat/completions", {"model": "bad name!", "messages": HI}, 400, "invalid model name"),
        ("/v1/completions", {"model": "tiny", "prompt": ["a", "b"]}, 400, "invalid prompt"),
        ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model 'nope' not found"),
        ("/v1/embeddings", {"model": "tiny-embed", "input": [[1, 2, 3]]}, 400, "invalid input"),
        ("/v1/embeddings", {"model": "tiny-embed", "input": []}, 400, "invalid input"),
        ("/v1/embeddings", {"model": "tiny-embed", "input": "x", "encoding_format": "int8"},
         400, "Invalid value for 'encoding_format' = int8"),
        ("/v1/embeddings", {"model": "nope", "input": "x"}, 404,
         'model "nope" not found, try pulling it first'),
    ],
    ids=[
        "malformed-json", "empty-body", "unknown-model", "no-messages", "no-model",
        "image-without-projector", "remote-image-url", "tools-unsupported",
        "thinking-unsupported", "bad-reasoning-effort", "bad-temperature", "bad-stop",
        "null-content", "bad-model-name", "prompt-list", "completions-unknown-model",
        "token-array-input", "empty-input", "bad-encoding-format", "embeddings-unknown-model",
    ],
)  # fmt: skip
async def test_error_shapes(
    api_server, path: str, body: dict[str, Any] | bytes, status: int, message: str
) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            if isinstance(body, bytes):
                r = await c.post(path, content=body)
            else:
                r = await c.post(path, json=body)
            assert r.status_code == status, r.text
            assert r.headers["content-type"] == "application/json"
            error = r.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert message in error["message"]
            assert error["type"] == wire.error_type(status)
            assert error["type"] == {400: "invalid_request_error", 404: "not_found_error"}[status]
            assert (error["param"], error["code"]) == (None, None)


async def test_sdk_sees_typed_errors(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            with pytest.raises(openai.NotFoundError):
                await c.chat.completions.create(model="nope", messages=HI)
            with pytest.raises(openai.BadRequestError) as caught:
                await c.embeddings.create(model="tiny-embed", input=[[1, 2]])
            assert caught.value.body["type"] == "invalid_request_error"


async def test_queue_full_is_503_api_error(api_server) -> None:
    with trio.fail_after(20):
        async with api_server(max_queue=0) as srv:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                r = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": HI})
                assert r.status_code == 503
                assert r.json() == wire.error_object(QueueFullError.MESSAGE, 503)
                assert r.json()["error"]["type"] == "api_error"
            async with sdk(srv.url) as c:
                with pytest.raises(openai.InternalServerError) as caught:
                    await c.completions.create(model="tiny", prompt="x")
                assert caught.value.status_code == 503


async def test_runner_error_is_500_api_error(api_server) -> None:
    behaviour = SimulatedBehaviour(load_seconds=0.01, fail_load="error")
    with trio.fail_after(20):
        async with api_server(behaviour=behaviour) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            for stream in (False, True):  # before the first byte: a real status either way
                body = {"model": "tiny", "messages": HI, "stream": stream}
                r = await c.post("/v1/chat/completions", json=body)
                assert r.status_code == 500
                error = r.json()["error"]
                assert error["type"] == "api_error"
                assert "error loading model" in error["message"]


async def test_error_mid_stream_is_an_sse_error_event(api_server) -> None:
    behaviour = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=2000, crash_after_tokens=3)
    with trio.fail_after(20):
        async with api_server(behaviour=behaviour) as srv:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                body = {"model": "tiny", "messages": HI, "stream": True}
                r = await c.post("/v1/chat/completions", json=body)
                assert r.status_code == 200
                events = sse_events(r.text)
                assert len(events) == 4  # three tokens, the error, and no [DONE]
                assert all(e["choices"][0]["delta"]["content"] for e in events[:3])
                error = events[3]["error"]
                assert error["type"] == "api_error"
                assert "stopped" in error["message"]
            async with sdk(srv.url) as c:
                received = []
                with pytest.raises(openai.APIError, match="stopped"):
                    async for chunk in await c.chat.completions.create(
                        model="tiny", messages=HI, stream=True
                    ):
                        received.append(chunk)
                assert len(received) == 3


async def test_client_disconnect_cancels_generation(api_server) -> None:
    behaviour = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=50,
                                   default_num_predict=10_000)  # fmt: skip
    with trio.fail_after(20):
        async with api_server(behaviour=behaviour) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            body = {"model": "tiny", "messages": HI, "stream": True}
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    assert line.startswith("data: {")
                    break
                (info,) = srv.scheduler.ps()
                assert info.refs == 1
                engine = srv.engines.engines["tiny:latest"]
                assert engine.active_streams == 1
            # Leaving the block closes the connection mid-stream.
            await eventually(lambda: srv.scheduler.ps()[0].refs == 0, within=1)
            assert engine.active_streams == 0
            assert engine.completed_streams == 0
            # The runner is still loaded and serves the next request.
            r = await c.post("/v1/completions",
                             json={"model": "tiny", "prompt": "x", "max_tokens": 2})  # fmt: skip
            assert r.json()["usage"]["completion_tokens"] == 2


# -- request translation (at the engine seam) ------------------------------------------


async def test_chat_request_translation(api_server, tiny_gguf) -> None:
    model, engines = tiny_gguf(chat_template=TOOLS_TEMPLATE), ScriptedEngines()
    with trio.fail_after(20):
        async with api_server(engines=engines, models={"helper": model}) as srv:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                messages = [
                    {"role": "developer", "content": "be brief"},
                    {"role": "user", "content": [{"type": "text", "text": "weather?"},
                                                 {"type": "text", "text": "in Paris"}]},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                ]  # fmt: skip
                r = await c.post("/v1/chat/completions", json={
                    "model": "helper", "messages": messages, "max_tokens": 5, "seed": 42,
                    "stop": "END", "frequency_penalty": 0.5, "presence_penalty": 0.25,
                    "response_format": {"type": "json_object"}, "reasoning_effort": "low",
                })  # fmt: skip
                assert r.status_code == 200, r.text
                r = await c.post("/v1/chat/completions", json={
                    "model": "helper", "messages": HI, "temperature": 0.2, "top_p": 0.5,
                    "stop": ["a", "b"], "reasoning": {"effort": "none"},
                    "response_format": {"type": "json_schema", "json_schema": {
                        "name": "x", "schema": {"type": "object"}}},
                })  # fmt: skip
                assert r.status_code == 200, r.text
    first, second = engines.requests
    assert first.messages == [
        Message("system", "be brief"),
        Message("user", "weather?\nin Paris"),
        Message("assistant", tool_calls=(ToolCall("get_weather", {"city": "Paris"}, id="call_1"),)),
        Message("tool", "sunny", tool_name="get_weather", tool_call_id="call_1"),
    ]
    assert dict(first.options) == {
        "temperature": 1.0, "top_p": 1.0, "num_predict": 5, "seed": 42, "stop": ["END"],
        "frequency_penalty": 0.5, "presence_penalty": 0.25,
    }  # fmt: skip
    assert first.format == "json"
    assert first.think == "low"
    assert first.tools is None
    assert dict(second.options) == {"temperature": 0.2, "top_p": 0.5, "stop": ["a", "b"]}
    assert second.format == {"type": "object"}
    assert second.think is False


async def test_completions_request_translation(api_server, tiny_gguf) -> None:
    engines = ScriptedEngines()
    # A suffix needs a model whose template takes one (Ollama's insert capability).
    coder = tiny_gguf(chat_template="{{ prompt }}{% if suffix %}{{ suffix }}{% endif %}")
    with trio.fail_after(20):
        async with api_server(engines=engines, models={"coder": coder}) as srv, sdk(srv.url) as c:
            await c.completions.create(model="coder", prompt="def f(", suffix="return 1")
            await c.completions.create(model="tiny", prompt="hello", temperature=0)
    infill, plain = engines.requests
    assert (infill.prompt, infill.suffix, infill.messages) == ("def f(", "return 1", None)
    assert plain.prompt is None
    assert plain.messages == [Message("user", "hello")]
    assert dict(plain.options) == {"temperature": 0.0, "top_p": 1.0}


async def test_keep_alive_and_options_as_extra_body_fields(api_server) -> None:
    engines = ScriptedEngines()
    with trio.fail_after(20):
        async with api_server(engines=engines) as srv, sdk(srv.url) as c:
            await c.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                extra_body={"keep_alive": -1, "options": {"num_ctx": 512, "top_k": 3}},
            )
            (info,) = srv.scheduler.ps()
            assert info.expires_at is None  # kept forever
            assert info.context_length == 512
            await c.completions.create(model="tiny", prompt="hi", extra_body={"keep_alive": "1m"})
            assert srv.scheduler.ps()[0].keep_alive == 60
            with pytest.raises(openai.BadRequestError, match="options"):
                await c.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": "hi"}],
                    extra_body={"options": ["not", "an", "object"]},
                )
    assert engines.requests[0].options["top_k"] == 3


@pytest.mark.parametrize("stream", [False, True])
async def test_an_empty_prompt_with_keep_alive_0_unloads(api_server, stream: bool) -> None:
    """As Ollama's ``/api/generate`` unload, answered in the dialect: no text, and Ollama's
    ``done_reason`` as the finish reason (its middleware passes it on)."""
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            await c.completions.create(model="tiny", prompt="hi", max_tokens=2)
            assert len(srv.scheduler.ps()) == 1
            unload = {"keep_alive": 0}
            if stream:
                events = await c.completions.create(
                    model="tiny", prompt="", stream=True, extra_body=unload
                )
                (answer,) = [event async for event in events]
            else:
                answer = await c.completions.create(model="tiny", prompt="", extra_body=unload)
            assert answer.object == "text_completion"
            assert answer.choices[0].text == ""
            assert answer.choices[0].finish_reason == "unload"
            await srv.scheduler.wait_idle()
            assert srv.scheduler.ps() == []


async def test_tool_calls(api_server, tiny_gguf) -> None:
    model, engines = tiny_gguf(chat_template=TOOLS_TEMPLATE), ScriptedEngines()
    with trio.fail_after(20):
        async with api_server(engines=engines, models={"helper": model}) as srv:
            async with sdk(srv.url) as c:
                resp = await c.chat.completions.create(
                    model="helper", messages=HI, tools=[WEATHER_TOOL]
                )
                (choice,) = resp.choices
                assert choice.finish_reason == "tool_calls"
                (call,) = choice.message.tool_calls or ()
                assert call.type == "function"
                assert call.id.startswith("call_")
                assert call.function.name == "get_weather"
                assert json.loads(call.function.arguments) == {"city": "Paris"}
                assert choice.message.model_extra == {"reasoning": "the user wants the weather"}
                assert resp.usage is not None
                assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (7, 5)

                chunks = [
                    chunk
                    async for chunk in await c.chat.completions.create(
                        model="helper", messages=HI, tools=[WEATHER_TOOL], stream=True,
                    )
                ]  # fmt: skip
                thinking, calling, finish = chunks
                assert thinking.choices[0].delta.model_extra == {
                    "reasoning": "the user wants the weather"
                }
                (delta,) = calling.choices[0].delta.tool_calls or ()
                assert delta.index == 0
                assert delta.function is not None
                assert delta.function.name == "get_weather"
                assert json.loads(delta.function.arguments or "") == {"city": "Paris"}
                assert finish.choices[0].finish_reason == "tool_calls"

                # The SDK's own accumulator rebuilds the message from the deltas.
                async with c.chat.completions.stream(
                    model="helper", messages=HI, tools=[WEATHER_TOOL]
                ) as events:
                    final = await events.get_final_completion()
                (choice,) = final.choices
                assert choice.finish_reason == "tool_calls"
                (call,) = choice.message.tool_calls or ()
                assert call.function.name == "get_weather"
                assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert engines.requests[0].tools == [WEATHER_TOOL]


# -- the translation functions ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "options"),
    [
        ({}, {"temperature": 1.0, "top_p": 1.0}),
        ({"temperature": 0, "top_p": 0.1}, {"temperature": 0, "top_p": 0.1}),
        ({"temperature": None}, {"temperature": 1.0, "top_p": 1.0}),
        ({"max_tokens": 7}, {"temperature": 1.0, "top_p": 1.0, "num_predict": 7}),
        ({"max_tokens": 7, "max_completion_tokens": 9},
         {"temperature": 1.0, "top_p": 1.0, "num_predict": 9}),
        ({"stop": "x"}, {"temperature": 1.0, "top_p": 1.0, "stop": ["x"]}),
        ({"seed": 3, "frequency_penalty": 1, "presence_penalty": 2},
         {"temperature": 1.0, "top_p": 1.0, "seed": 3, "frequency_penalty": 1,
          "presence_penalty": 2}),
        ({"options": {"num_ctx": 8192, "temperature": 0.2, "top_k": 5}},
         {"temperature": 0.2, "top_p": 1.0, "num_ctx": 8192, "top_k": 5}),
        ({"temperature": 0.7, "options": {"temperature": 0.2}},
         {"temperature": 0.7, "top_p": 1.0}),
    ],
    ids=["defaults", "given", "null-is-default", "max_tokens", "max_completion_tokens-wins",
         "stop-string", "seed-and-penalties", "ollama-options", "openai-field-wins"],
)  # fmt: skip
def test_sampling_options(body: dict[str, Any], options: dict[str, Any]) -> None:
    assert wire.sampling_options(body) == options


@pytest.mark.parametrize(
    ("body", "think"),
    [
        ({}, None),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "minimal"}, "low"),
        ({"reasoning_effort": "medium"}, "medium"),
        ({"reasoning_effort": "xhigh"}, "max"),
        ({"reasoning": {"effort": "high"}, "reasoning_effort": "low"}, "high"),
    ],
    ids=["absent", "none", "minimal", "medium", "xhigh", "nested-wins"],
)
def test_reasoning_effort(body: dict[str, Any], think: bool | str | None) -> None:
    assert wire.reasoning(body) == think


@pytest.mark.parametrize(
    ("value", "fmt"),
    [
        (None, None),
        ({"type": "text"}, None),
        ({"type": "json_object"}, "json"),
        ({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "array"}}},
         {"type": "array"}),
        ({"type": "json_schema", "json_schema": {"name": "n"}}, None),
    ],
    ids=["absent", "text", "json_object", "json_schema", "schema-less"],
)  # fmt: skip
def test_response_format(value: Any, fmt: Any) -> None:
    assert wire.response_format(value) == fmt


@pytest.mark.parametrize(
    "url",
    ["data:image/gif;base64,R0lG", "data:image/png;base64,!!!", "file:///etc/passwd"],
    ids=["unsupported-type", "not-base64", "not-a-data-url"],
)
def test_bad_image_urls(url: str) -> None:
    with pytest.raises(InvalidRequestError, match="invalid image input"):
        wire.decode_image_url(url)


def test_image_parts_become_message_images() -> None:
    (message,) = wire.chat_messages(image_message(f"data:image/png;base64,{PNG_1PX}"))
    assert message == Message(role="user", content="what is this?", images=(PNG_1PX,))


def test_base64_embeddings_are_little_endian_float32() -> None:
    vector: Sequence[float] = [1.0, -2.5, 0.125]
    assert base64.b64decode(wire.floats_base64(vector)) == struct.pack("<3f", *vector)


# -- the real model (slow) -------------------------------------------------------------


@pytest.mark.slow
async def test_smollm2_chat_through_the_sdk(api_server, smollm2_path: Path) -> None:
    from ollamatrio.engines.process import ProcessEngineFactory

    engines = ProcessEngineFactory(load_timeout=120)
    with trio.fail_after(240):
        async with (
            api_server(engines=engines, models={"smol": smollm2_path}) as srv,
            sdk(srv.url) as c,
        ):
            resp = await c.chat.completions.create(
                model="smol",
                messages=[
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is the capital of France?"},
                ],
                max_tokens=32,
                temperature=0,
            )
            assert "Paris" in (resp.choices[0].message.content or "")
            assert resp.choices[0].finish_reason in ("stop", "length")
            assert resp.usage is not None
            assert 0 < resp.usage.completion_tokens <= 32
            deltas = [
                chunk.choices[0].delta.content or ""
                async for chunk in await c.chat.completions.create(
                    model="smol", messages=[{"role": "user", "content": "Say hello."}],
                    max_tokens=8, temperature=0, stream=True,
                )
                if chunk.choices
            ]  # fmt: skip
            assert "".join(deltas).strip()
