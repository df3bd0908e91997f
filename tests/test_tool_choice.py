"""``tool_choice`` on ``/v1/chat/completions``, ``/v1/responses`` and ``/v1/messages``:
each dialect's spelling read into the core's terms, a required call forced through the
runner's grammar (a JSON schema of the call), malformed calls returned as text and counted;
and SmolLM2 in a real runner made to call, to call a named tool, and not to call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import trio
from helpers.templates import TOOLS_CHATML

from ollamatrio.api.anthropic import wire as anthropic_wire
from ollamatrio.api.openai import wire as openai_wire
from ollamatrio.api.responses import wire as responses_wire
from ollamatrio.engines import llamacpp_wire
from ollamatrio.engines.llamacpp_wire import ChatStream
from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.errors import InvalidRequestError
from ollamatrio.generation.requests import ChatRequest, ToolCall, ToolChoice
from ollamatrio.types import Chunk, CompletionRequest, Message

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"{what} in a city",
                                      "parameters": PARAMS}}
    for name, what in (("get_weather", "Weather"), ("get_time", "Time"))
]  # fmt: skip
RESPONSES_TOOLS = [{"type": "function", **tool["function"]} for tool in CHAT_TOOLS]
ANTHROPIC_TOOLS = [
    {"name": t["name"], "description": t["description"], "input_schema": PARAMS}
    for t in RESPONSES_TOOLS
]
HI = [{"role": "user", "content": "hi"}]
REQUIRED = ToolChoice(required=True)
TIME = ToolChoice(required=True, name="get_time")

# SDKs may stop reading a stream without closing their inner async generators.
pytestmark = [
    pytest.mark.filterwarnings(f"ignore:Async generator '{module}\\.:ResourceWarning")
    for module in ("anthropic", "openai", "httpx", "httpcore")
]


def chat(choice: Any) -> ChatRequest:
    body = {"model": "m", "messages": HI, "tools": CHAT_TOOLS, "tool_choice": choice}
    return openai_wire.chat_request(body).core


def responses(choice: Any) -> ChatRequest:
    body = {"model": "m", "input": "hi", "tools": RESPONSES_TOOLS, "tool_choice": choice}
    return responses_wire.chat_request(responses_wire.responses_call(body))


def messages(choice: Any) -> ChatRequest:
    body = {"model": "m", "max_tokens": 8, "messages": HI, "tools": ANTHROPIC_TOOLS,
            "tool_choice": choice}  # fmt: skip
    return anthropic_wire.messages_request(body).core


@pytest.mark.parametrize(
    ("translate", "choice", "offered", "expected"),
    [
        (chat, None, 2, ToolChoice()),
        (chat, "auto", 2, ToolChoice()),
        (chat, "none", 0, ToolChoice()),
        (chat, "required", 2, REQUIRED),
        (chat, {"type": "function", "function": {"name": "get_time"}}, 2, TIME),
        (responses, "auto", 2, ToolChoice()),
        (responses, "none", 0, ToolChoice()),
        (responses, "required", 2, REQUIRED),
        (responses, {"type": "function", "name": "get_time"}, 2, TIME),
        (messages, None, 2, ToolChoice()),
        (messages, {"type": "auto"}, 2, ToolChoice()),
        (messages, {"type": "none"}, 0, ToolChoice()),
        (messages, {"type": "any"}, 2, REQUIRED),
        (messages, {"type": "any", "disable_parallel_tool_use": True}, 2, REQUIRED),
        (messages, {"type": "tool", "name": "get_time"}, 2, TIME),
    ],
)
def test_each_dialect_reads_its_tool_choice(
    translate: Any, choice: Any, offered: int, expected: ToolChoice
) -> None:
    """Named tools leave every tool offered (the prompt stays the same); ``none`` offers
    none."""
    core = translate(choice)
    assert (len(core.tools), core.tool_choice) == (offered, expected)


@pytest.mark.parametrize(
    ("translate", "choice", "error"),
    [
        (chat, "sometimes", "invalid value for 'tool_choice'"),
        (chat, {"type": "function", "function": {"name": "fly"}}, 'no tool named "fly"'),
        (chat, {"type": "function"}, "the function's name is required"),
        (responses, {"type": "function", "name": "fly"}, 'no tool named "fly"'),
        (messages, {"type": "tool", "name": "fly"}, 'no tool named "fly"'),
        (messages, {"type": "maybe"}, "tool_choice.type: unknown value"),
        (messages, "any", "tool_choice.type: unknown value"),
    ],
)
def test_bad_tool_choices_are_400s(translate: Any, choice: Any, error: str) -> None:
    with pytest.raises(InvalidRequestError, match=error):
        translate(choice)


def test_a_required_call_without_tools_is_a_400() -> None:
    with pytest.raises(InvalidRequestError, match="no tools are given"):
        openai_wire.chat_request({"model": "m", "messages": HI, "tool_choice": "required"})
    body = {"model": "m", "max_tokens": 8, "messages": HI, "tool_choice": {"type": "any"}}
    with pytest.raises(InvalidRequestError, match="no tools are given"):
        anthropic_wire.messages_request(body)


def engine_body(choice: ToolChoice, **extra: Any) -> dict[str, Any]:
    request = CompletionRequest(
        messages=[Message("user", "hi")], tools=CHAT_TOOLS, tool_choice=choice, **extra
    )
    return llamacpp_wire.chat_request(request, 2048, "m")[1]


def test_a_required_call_is_a_schema_over_the_offered_tools() -> None:
    auto = engine_body(ToolChoice())
    assert "tool_choice" not in auto
    assert "json_schema" not in auto
    required = engine_body(REQUIRED, format="json")
    # Every tool stays in the prompt; llama.cpp's own (lazy) tool grammar is off.
    assert (required["tools"], required["tool_choice"]) == (CHAT_TOOLS, "none")
    assert "response_format" not in required  # the call's schema is the answer's format
    assert [o["properties"]["name"] for o in required["json_schema"]["anyOf"]] == [
        {"const": "get_weather"}, {"const": "get_time"},
    ]  # fmt: skip
    named = engine_body(TIME)
    assert named["tools"] == CHAT_TOOLS
    assert named["json_schema"] == {
        "type": "object",
        "properties": {"name": {"const": "get_time"}, "arguments": PARAMS},
        "required": ["name", "arguments"],
    }


def sse(content: str = "", finish: str | None = None, **delta: Any) -> dict[str, Any]:
    choice = {"delta": {"content": content, **delta}, "finish_reason": finish}
    return {"choices": [choice], "timings": {"prompt_n": 3, "predicted_n": 9}}


def run(stream: ChatStream, *events: dict[str, Any]) -> list[Chunk]:
    chunks = [chunk for event in events for chunk in stream.feed(event)]
    return chunks + stream.finish()


def test_a_forced_answer_becomes_the_call() -> None:
    chunks = run(
        ChatStream(forced_call=True),
        sse('{"name": "get_time", '),
        sse('"arguments": {"city": "Paris"}}', finish="stop"),
    )
    assert [c.content for c in chunks if c.content] == []
    assert [c.tool_calls for c in chunks if c.tool_calls] == [
        [ToolCall("get_time", {"city": "Paris"})]
    ]
    assert chunks[-1].done
    assert chunks[-1].malformed_tool_calls == 0


def test_a_forced_answer_cut_short_is_text_and_counted() -> None:
    chunks = run(ChatStream(forced_call=True), sse('{"name": "get_ti', finish="length"))
    assert [c.content for c in chunks if c.content] == ['{"name": "get_ti']
    assert not any(c.tool_calls for c in chunks)
    assert (chunks[-1].done_reason, chunks[-1].malformed_tool_calls) == ("length", 1)


def test_malformed_calls_the_runner_parsed_are_text_and_counted() -> None:
    def call(index: int, name: str, arguments: str) -> dict[str, Any]:
        function = {"name": name, "arguments": arguments}
        return {"index": index, "id": f"c{index}", "function": function}

    chunks = run(
        ChatStream(),
        sse("Let me see.", tool_calls=[call(0, "get_time", '{"city": "Paris"}')]),
        sse(tool_calls=[call(1, "get_weather", '{"city": Paris')]),
        sse(tool_calls=[call(2, "", "{}")], finish="tool_calls"),
    )
    assert [c.content for c in chunks if c.content] == [
        "Let me see.",
        '\n{"name": "get_weather", "arguments": {"city": Paris}\n{"name": "", "arguments": {}}',
    ]
    assert [c.tool_calls for c in chunks if c.tool_calls] == [
        [ToolCall("get_time", {"city": "Paris"}, "c0")]
    ]
    assert chunks[-1].malformed_tool_calls == 2


# -- a real runner ----------------------------------------------------------------------


def scraped(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.slow
async def test_smollm2_is_made_to_call_and_not_to_call(api_server, smollm2_path: Path) -> None:
    """SmolLM2 (which on its own answers in prose) calls a tool when one is required, the
    named one when it is named, and none with ``none``, through each dialect; a forced call
    cut short by ``max_tokens`` comes back as text and is counted in ``/metrics``."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    sampling: dict[str, Any] = {"temperature": 0, "max_tokens": 48}
    with trio.fail_after(420):
        async with api_server(
            engines=ProcessEngineFactory(load_timeout=120), models={"smol": smollm2_path}
        ) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=300) as c:
                created = await c.post("/api/create", json={
                    "model": "smol-tools", "from": "smol", "template": TOOLS_CHATML,
                    "stream": False,
                })  # fmt: skip
                assert created.status_code == 200, created.text
                v1 = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="ollama", max_retries=0)
                async with v1:
                    free = await v1.chat.completions.create(
                        model="smol-tools", messages=ask, tools=CHAT_TOOLS,
                        **{**sampling, "max_tokens": 8},
                    )  # fmt: skip
                    required = await v1.chat.completions.create(
                        model="smol-tools", messages=ask, tools=CHAT_TOOLS,
                        tool_choice="required", **sampling,
                    )  # fmt: skip
                    named = await v1.chat.completions.create(
                        model="smol-tools", messages=ask, tools=CHAT_TOOLS,
                        tool_choice={"type": "function", "function": {"name": "get_time"}},
                        **sampling,
                    )  # fmt: skip
                    none = await v1.chat.completions.create(
                        model="smol-tools", messages=ask, tools=CHAT_TOOLS, tool_choice="none",
                        **{**sampling, "max_tokens": 8},
                    )  # fmt: skip
                    cut = await v1.chat.completions.create(
                        model="smol-tools", messages=ask, tools=CHAT_TOOLS,
                        tool_choice="required", temperature=0, max_tokens=4,
                    )  # fmt: skip
                    responded = await v1.responses.create(
                        model="smol-tools", input=ask, tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
                        tool_choice="required", temperature=0, max_output_tokens=48,
                    )  # fmt: skip
                async with anthropic.AsyncAnthropic(
                    base_url=srv.url, api_key="ollama", max_retries=0
                ) as claude:
                    message = await claude.messages.create(
                        model="smol-tools", max_tokens=48, messages=ask, tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
                        tool_choice={"type": "tool", "name": "get_weather"},
                        extra_body={"temperature": 0},
                    )  # fmt: skip
                metrics = (await c.get("/metrics")).text

    # On its own the model answers in prose: nothing else makes it call.
    assert not free.choices[0].message.tool_calls
    calls = required.choices[0].message.tool_calls
    assert calls
    assert calls[0].function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(calls[0].function.arguments), dict)
    assert required.choices[0].finish_reason == "tool_calls"
    named_calls = named.choices[0].message.tool_calls
    assert named_calls
    assert [c.function.name for c in named_calls] == ["get_time"]
    assert not none.choices[0].message.tool_calls
    assert none.choices[0].message.content
    assert [item.type for item in responded.output] == ["function_call"]
    assert [(b.type, getattr(b, "name", "")) for b in message.content] == [
        ("tool_use", "get_weather")
    ]
    assert message.stop_reason == "tool_use"
    # Cut short after 4 tokens: the start of the call, as text, counted.
    assert not cut.choices[0].message.tool_calls
    assert (cut.choices[0].message.content or "").startswith("{")
    assert cut.choices[0].finish_reason == "length"
    malformed = 'ollamatrio_malformed_tool_calls_total{model="smol-tools:latest"}'
    assert scraped(metrics, malformed) == 1
