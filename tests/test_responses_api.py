"""``/v1/responses`` on real hypercorn with the official ``openai`` SDK: one-piece and
streamed responses, tool calls, and the stored side (retrieve, delete, input items,
``previous_response_id``, a restart).  Translation is checked at the engine seam with an
engine factory that records every :class:`CompletionRequest` and answers a tool offer with
a call (which the simulated engine cannot do)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import openai
import pytest
import trio
from helpers.scripted import ScriptedEngines, weather_call_written

from ollamatrio.generation.requests import Message, ToolCall
from ollamatrio.testing.tiny_gguf import CHATML
from ollamatrio.types import Chunk, ToolCallDelta

TOOLS_TEMPLATE = CHATML + "{% if tools %}{{ tools }}{% endif %}{% if enable_thinking %}{% endif %}"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}

pytestmark = [
    pytest.mark.filterwarnings(f"ignore:Async generator '{module}\\.:ResourceWarning")
    for module in ("openai", "httpx2", "httpcore2")
]


@asynccontextmanager
async def sdk(url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="ollama", max_retries=0) as c:
        yield c


async def test_create_retrieve_delete(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            resp = await c.responses.create(
                model="tiny", input="why is the sky blue?", instructions="be brief"
            )
            assert resp.id.startswith("resp_")
            assert resp.object == "response"
            assert resp.status == "completed"
            assert resp.model == "tiny"
            assert resp.instructions == "be brief"
            (item,) = resp.output
            assert item.type == "message"
            assert item.role == "assistant"
            assert resp.output_text
            assert resp.usage is not None
            assert resp.usage.input_tokens > 0
            assert resp.usage.output_tokens > 0
            assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens

            again = await c.responses.retrieve(resp.id)
            assert again.model_dump() == resp.model_dump()
            items = await c.responses.input_items.list(resp.id)
            (given,) = items.data
            assert given.type == "message"
            assert given.role == "user"
            assert given.id.startswith("msg_")

            await c.responses.delete(resp.id)
            with pytest.raises(openai.NotFoundError) as missing:
                await c.responses.retrieve(resp.id)
            assert missing.value.status_code == 404
            assert missing.value.body["message"] == f"Response with id '{resp.id}' not found."
            with pytest.raises(openai.NotFoundError):
                await c.responses.delete(resp.id)


async def test_store_false_keeps_nothing(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            resp = await c.responses.create(model="tiny", input="hello", store=False)
            assert resp.store is False
            with pytest.raises(openai.NotFoundError):
                await c.responses.retrieve(resp.id)


async def test_max_output_tokens_is_incomplete(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            resp = await c.responses.create(model="tiny", input="hello", max_output_tokens=2)
            assert resp.status == "incomplete"
            assert resp.incomplete_details is not None
            assert resp.incomplete_details.reason == "max_output_tokens"
            assert resp.usage is not None
            assert resp.usage.output_tokens == 2


async def test_a_capped_stream_ends_incomplete_as_openai_sends_it(api_server) -> None:
    """OpenAI ends a stream cut by ``max_output_tokens`` with ``response.incomplete`` (not
    ``response.completed``): the SDK's stream helper yields it with the whole response,
    and its ``get_final_response()`` refuses it, as it does against OpenAI."""
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            async with c.responses.stream(
                model="tiny", input="hello", max_output_tokens=2
            ) as stream:
                events = [e async for e in stream]
                with pytest.raises(RuntimeError, match=r"response\.completed"):
                    await stream.get_final_response()
            last = events[-1]
            assert last.type == "response.incomplete"
            assert "response.completed" not in [e.type for e in events]
            assert last.response.status == "incomplete"
            assert last.response.incomplete_details is not None
            assert last.response.incomplete_details.reason == "max_output_tokens"
            assert last.response.usage is not None
            assert last.response.usage.output_tokens == 2
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert last.response.output_text == text
            stored = await c.responses.retrieve(last.response.id)
            assert stored.model_dump() == last.response.model_dump()


async def test_stream_events_and_the_stored_object(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            events = [e async for e in await c.responses.create(
                model="tiny", input="hello", stream=True)]  # fmt: skip
            kinds = [e.type for e in events]
            assert kinds[:5] == [
                "response.created", "response.in_progress", "response.output_item.added",
                "response.content_part.added", "response.output_text.delta",
            ]  # fmt: skip
            assert kinds[-4:] == [
                "response.output_text.done", "response.content_part.done",
                "response.output_item.done", "response.completed",
            ]  # fmt: skip
            assert [e.sequence_number for e in events] == list(range(len(events)))
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            final = events[-1].response
            assert final.output_text == text
            stored = await c.responses.retrieve(final.id)
            assert stored.model_dump() == final.model_dump()

            # The SDK's own accumulator.
            async with c.responses.stream(model="tiny", input="hello") as stream:
                done = await stream.get_final_response()
            assert done.status == "completed"
            assert done.output_text


async def test_tool_calls_and_their_history(api_server, tiny_gguf) -> None:
    engines = ScriptedEngines()
    model = tiny_gguf(chat_template=TOOLS_TEMPLATE)
    with trio.fail_after(20):
        async with api_server(engines=engines, models={"helper": model}) as srv:
            async with sdk(srv.url) as c:
                resp = await c.responses.create(
                    model="helper", input="weather in Paris?", tools=[WEATHER],
                    reasoning={"effort": "low"},
                )  # fmt: skip
                reasoning, call = resp.output
                assert reasoning.type == "reasoning"
                assert reasoning.summary[0].text == "the user wants the weather"
                assert call.type == "function_call"
                assert call.name == "get_weather"
                assert json.loads(call.arguments) == {"city": "Paris"}
                assert call.call_id
                first = engines.requests[-1]
                assert first.tools == [
                    {"type": "function", "function": {
                        "name": "get_weather", "description": "Weather in a city",
                        "parameters": WEATHER["parameters"]}},
                ]  # fmt: skip
                assert first.think == "low"

                # The stream's final object is the stored one.
                async with c.responses.stream(
                    model="helper", input="weather in Paris?", tools=[WEATHER]
                ) as stream:
                    streamed = await stream.get_final_response()
                assert [i.type for i in streamed.output] == ["reasoning", "function_call"]
                stored = await c.responses.retrieve(streamed.id)
                # (The helper's parsed items add parsed_arguments; the rest is the same.)
                assert [i.model_dump(exclude={"parsed_arguments"}) for i in streamed.output] == [
                    i.model_dump() for i in stored.output
                ]

                # The call's output continues the stored conversation, without tools now.
                await c.responses.create(
                    model="helper", previous_response_id=resp.id,
                    input=[{"type": "function_call_output", "call_id": call.call_id,
                            "output": "sunny"}],
                )  # fmt: skip
    assert list(engines.requests[-1].messages or ()) == [
        Message(role="user", content="weather in Paris?"),
        Message(
            role="assistant", thinking="the user wants the weather",
            tool_calls=(ToolCall("get_weather", {"city": "Paris"}, id=call.call_id),),
        ),
        Message(role="tool", content="sunny", tool_name="get_weather", tool_call_id=call.call_id),
    ]  # fmt: skip


async def test_a_call_streams_as_the_model_writes_it(api_server, tiny_gguf) -> None:
    """A function call's item opens when the model starts it and its arguments arrive as
    they are written (OpenAI's order), not as a whole item at the end; the SDK's helper
    accumulates them into the stored object."""
    engines = ScriptedEngines(weather_call_written)
    model = tiny_gguf(chat_template=TOOLS_TEMPLATE)
    with trio.fail_after(20):
        async with api_server(engines=engines, models={"helper": model}) as srv, sdk(srv.url) as c:
            ask = {"model": "helper", "input": "weather in Paris?", "tools": [WEATHER]}
            events = [e async for e in await c.responses.create(**ask, stream=True)]
            calls = [
                (e.type, getattr(e, "delta", None)) for e in events
                if e.type.startswith("response.function_call")
                or getattr(getattr(e, "item", None), "type", "") == "function_call"
            ]  # fmt: skip
            assert calls == [
                ("response.output_item.added", None),
                ("response.function_call_arguments.delta", '{"city":'),
                ("response.function_call_arguments.delta", '"Paris"}'),
                ("response.function_call_arguments.done", None),
                ("response.output_item.done", None),
            ]
            added = next(e for e in events if e.type == "response.output_item.added"
                         and e.item.type == "function_call")  # fmt: skip
            assert (added.item.name, added.item.call_id, added.item.arguments) == (
                "get_weather", "call_w", "",
            )  # fmt: skip
            assert added.output_index == 1  # after the message, which closed first
            kinds = [e.type for e in events]
            assert kinds.index("response.output_item.done") < kinds.index(
                "response.output_item.added", kinds.index("response.output_text.done")
            )
            async with c.responses.stream(**ask) as stream:
                final = await stream.get_final_response()
            message, call = final.output
            assert message.type == "message"
            assert call.type == "function_call"
            assert (call.name, call.call_id, json.loads(call.arguments)) == (
                "get_weather", "call_w", {"city": "Paris"},
            )  # fmt: skip
            stored = await c.responses.retrieve(final.id)
            assert stored.output[1].model_dump() == call.model_dump(exclude={"parsed_arguments"})


def weather_call_malformed(name: str) -> list[Chunk]:
    """A call streamed as written whose arguments prove not to be a JSON object: the engine
    gives it back as text (forced_call.as_text), not as a call."""
    return [
        Chunk(tool_call_deltas=[ToolCallDelta(0, "call_m", name)]),
        Chunk(tool_call_deltas=[ToolCallDelta(0, arguments='{"city": Par')]),
        Chunk(content='get_weather {"city": Par'),
        Chunk(done=True, done_reason="stop", prompt_eval_count=7, eval_count=6,
              malformed_tool_calls=1),
    ]  # fmt: skip


async def test_a_streamed_call_that_proves_malformed_is_closed(api_server, tiny_gguf) -> None:
    """Every item the stream opened is closed: a call that proved malformed ends
    ``incomplete`` with the arguments as written, and the answer carries it as text."""
    engines = ScriptedEngines(weather_call_malformed)
    model = tiny_gguf(chat_template=TOOLS_TEMPLATE)
    with trio.fail_after(20):
        async with api_server(engines=engines, models={"helper": model}) as srv, sdk(srv.url) as c:
            ask = {"model": "helper", "input": "weather in Paris?", "tools": [WEATHER]}
            events = [e async for e in await c.responses.create(**ask, stream=True)]
            added = {e.output_index for e in events if e.type == "response.output_item.added"}
            done = {e.output_index: e.item for e in events if e.type == "response.output_item.done"}
            assert added == set(done)
            call = done[0]
            assert (call.type, call.status, call.arguments) == (
                "function_call", "incomplete", '{"city": Par',
            )  # fmt: skip
            final = events[-1]
            assert final.type == "response.completed"
            assert [item.type for item in final.response.output] == ["message"]
            assert "Par" in final.response.output_text


async def test_a_conversation_survives_a_restart(api_server) -> None:
    engines = ScriptedEngines()
    with trio.fail_after(30):
        async with api_server(engines=engines) as srv, sdk(srv.url) as c:
            first = await c.responses.create(model="tiny", input="my name is Ada")
        async with api_server(engines=engines) as srv, sdk(srv.url) as c:
            assert (await c.responses.retrieve(first.id)).output_text == first.output_text
            second = await c.responses.create(
                model="tiny", previous_response_id=first.id, input="what is my name?",
                instructions="answer briefly",
            )  # fmt: skip
            assert second.previous_response_id == first.id
            third = await c.responses.create(
                model="tiny", previous_response_id=second.id, input="and again?"
            )
            assert third.status == "completed"
    # The whole history, as /api/chat would be given it; instructions are not carried on.
    assert list(engines.requests[-2].messages or ()) == [
        Message(role="system", content="answer briefly"),
        Message(role="user", content="my name is Ada"),
        Message(role="assistant", content=first.output_text),
        Message(role="user", content="what is my name?"),
    ]
    assert list(engines.requests[-1].messages or ()) == [
        Message(role="user", content="my name is Ada"),
        Message(role="assistant", content=first.output_text),
        Message(role="user", content="what is my name?"),
        Message(role="assistant", content=second.output_text),
        Message(role="user", content="and again?"),
    ]


async def test_errors_in_openai_shape(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, sdk(srv.url) as c:
            with pytest.raises(openai.NotFoundError) as missing:
                await c.responses.create(model="tiny", input="hi", previous_response_id="resp_nope")
            assert missing.value.body["message"] == "Response with id 'resp_nope' not found."
            with pytest.raises(openai.NotFoundError):
                await c.responses.create(model="nope", input="hi")
            with pytest.raises(openai.BadRequestError) as bad:
                await c.responses.create(model="tiny", input=[{"type": "computer_call"}])
            assert "computer_call" in bad.value.body["message"]
            async with httpx.AsyncClient(base_url=srv.url) as raw:
                answer = await raw.get("/v1/responses/resp_nope/input_items")
            assert answer.status_code == 404
            assert answer.json()["error"]["message"] == "Response with id 'resp_nope' not found."
