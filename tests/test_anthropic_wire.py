"""The Anthropic dialect's pure translations, table-tested with the examples of Anthropic's
Messages API documentation (and the shapes Claude Code sends, docs/spec agents.md)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from ollamatrio.api.anthropic import wire
from ollamatrio.api.anthropic.stream import MessageEvents
from ollamatrio.errors import InvalidRequestError
from ollamatrio.generation.answer import Answer
from ollamatrio.generation.relay import Timings
from ollamatrio.generation.requests import ChatRequest, Message, ToolCall
from ollamatrio.types import Chunk

PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a")).decode()
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a given location",
    "input_schema": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
    },
}


def request(**body: Any) -> ChatRequest:
    hello = [{"role": "user", "content": "hi"}]
    return wire.messages_request({"model": "m", "max_tokens": 1024, "messages": hello, **body}).core


# -- requests: Anthropic's documented examples ---------------------------------------


@pytest.mark.parametrize(
    ("body", "messages"),
    [
        # "Basic request and response"
        ({"messages": [{"role": "user", "content": "Hello, Claude"}]},
         (Message("user", "Hello, Claude"),)),
        # "Multiple conversational turns"
        ({"messages": [
            {"role": "user", "content": "Hello there."},
            {"role": "assistant", "content": "Hi, I'm Claude. How can I help you?"},
            {"role": "user", "content": "Can you explain LLMs in plain English?"},
        ]}, (
            Message("user", "Hello there."),
            Message("assistant", "Hi, I'm Claude. How can I help you?"),
            Message("user", "Can you explain LLMs in plain English?"),
        )),
        # "Putting words in Claude's mouth": a prefilled assistant turn, blocks form
        ({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "Latin for Ant? (A) Apoidea"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "The answer is ("}]},
        ]}, (
            Message("user", "Latin for Ant? (A) Apoidea"),
            Message("assistant", "The answer is ("),
        )),
        # "Vision": a base64 image block beside text
        ({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG}},
            {"type": "text", "text": "What is in the above image?"},
        ]}]}, (Message("user", "What is in the above image?", images=(PNG,)),)),
        # system as a string, and as text blocks with cache_control (Claude Code)
        ({"system": "You are a pirate.", "messages": [{"role": "user", "content": "hi"}]},
         (Message("system", "You are a pirate."), Message("user", "hi"))),
        ({"system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
            {"type": "text", "text": "You are Claude Code.",
             "cache_control": {"type": "ephemeral"}},
        ], "messages": [{"role": "user", "content": "hi"}]}, (
            Message("system", "x-anthropic-billing-header: cc_version=2.1\nYou are Claude Code."),
            Message("user", "hi"),
        )),
        # Claude Code's environment message: role "system" inside messages
        ({"messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": [{"type": "text", "text": "cwd: /tmp"}]},
        ]}, (Message("user", "hi"), Message("system", "cwd: /tmp"))),
    ],
)  # fmt: skip
def test_messages(body: dict[str, Any], messages: tuple[Message, ...]) -> None:
    assert request(**body).messages == messages


def test_tool_use_history() -> None:
    """The documented tool-use round trip: the assistant's thinking and tool_use blocks, the
    user's tool_result (string and block content) ahead of their text."""
    req = request(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "What's the weather like in San Francisco?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should look it up.", "signature": "c2ln"},
                {"type": "text", "text": "I'll check."},
                {"type": "tool_use", "id": "toolu_01A", "name": "get_weather",
                 "input": {"location": "San Francisco, CA"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "15 degrees"},
                {"type": "text", "text": "And tomorrow?", "cache_control": {"type": "ephemeral"}},
            ]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_01B", "name": "get_weather",
                 "input": {"location": "SF"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01B", "is_error": False,
                 "content": [{"type": "text", "text": "16"}, {"type": "text", "text": "sunny"}]},
            ]},
        ],
    )  # fmt: skip
    assert req.messages == (
        Message("user", "What's the weather like in San Francisco?"),
        Message(
            "assistant", "I'll check.", thinking="I should look it up.",
            tool_calls=(ToolCall("get_weather", {"location": "San Francisco, CA"}, "toolu_01A"),),
        ),
        Message("tool", "15 degrees", tool_name="get_weather", tool_call_id="toolu_01A"),
        Message("user", "And tomorrow?"),
        Message("assistant", tool_calls=(ToolCall("get_weather", {"location": "SF"},
                                                  "toolu_01B"),)),
        Message("tool", "16\nsunny", tool_name="get_weather", tool_call_id="toolu_01B"),
    )  # fmt: skip
    assert req.tools == (
        {"type": "function", "function": {
            "name": "get_weather", "description": WEATHER["description"],
            "parameters": WEATHER["input_schema"]}},
    )  # fmt: skip


def test_tools_server_tools_and_tool_choice_none() -> None:
    hosted = {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}
    deferred = {**WEATHER, "defer_loading": True}
    assert [t["function"]["name"] for t in request(tools=[hosted, deferred]).tools] == [
        "get_weather"
    ]
    assert request(tools=[WEATHER], tool_choice={"type": "none"}).tools == ()
    assert len(request(tools=[WEATHER], tool_choice={"type": "auto"}).tools) == 1


def test_sampling_fields_are_options() -> None:
    req = request(temperature=0.5, top_p=0.9, top_k=40, stop_sequences=["\n\nHuman:"])
    assert req.options == {
        "num_predict": 1024, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
        "stop": ["\n\nHuman:"],
    }  # fmt: skip
    assert req.stream is False
    assert request(stream=True).stream is True
    assert req.report_stop  # stop_reason "stop_sequence" needs the sequence matched


@pytest.mark.parametrize(
    ("value", "think"),
    [(None, None), ({"type": "enabled", "budget_tokens": 2048}, True),
     ({"type": "disabled"}, False), ({"type": "adaptive", "display": "summarized"}, None)],
)  # fmt: skip
def test_thinking(value: Any, think: Any) -> None:
    assert request(thinking=value).think is think


def test_claude_code_extras_are_ignored() -> None:
    req = request(
        messages=[{"role": "user", "content": "hi"}],
        metadata={"user_id": json.dumps({"session_id": "s"})},
        context_management={"edits": []},
        output_config={"effort": "high"},
    )
    assert req.messages == (Message("user", "hi"),)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]},
         "max_tokens is required and must be positive"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}, "model is required"),
        ({"model": "m", "max_tokens": 8}, "messages is required"),
        ({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]},
         "max_tokens"),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "bot", "content": "hi"}]},
         "messages[0].role"),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]},
         "only base64 image sources"),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "not base64!"}}]}]},
         "invalid base64 image data"),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "document", "source": {}}]}]}, "unsupported content block type"),
        ({"model": "m", "max_tokens": 8, "stop_sequences": "x",
          "messages": [{"role": "user", "content": "hi"}]}, "stop_sequences"),
        ({"model": "m", "max_tokens": 8, "temperature": "hot",
          "messages": [{"role": "user", "content": "hi"}]}, "temperature"),
        ({"model": "m", "max_tokens": 8, "thinking": {"type": "sometimes"},
          "messages": [{"role": "user", "content": "hi"}]}, "thinking.type"),
    ],
)  # fmt: skip
def test_invalid_requests(body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        wire.messages_request(body)


def test_count_tokens_needs_no_max_tokens() -> None:
    req = wire.count_tokens_request(
        {"model": "m", "system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert req.messages == (Message("system", "be brief"), Message("user", "hi"))


# -- answers -------------------------------------------------------------------------

TIMINGS = Timings(
    total_duration=1, load_duration=0, prompt_eval_count=12, prompt_eval_duration=1,
    eval_count=6, eval_duration=1, prompt_cached_count=5,
)  # fmt: skip


def answer(**fields: Any) -> Answer:
    base: dict[str, Any] = {
        "content": "", "thinking": "", "tool_calls": (), "logprobs": (), "done_reason": "stop",
        "stop_sequence": "", "context": (), "timings": TIMINGS,
    }  # fmt: skip
    return Answer(**{**base, **fields})


def test_message_object_documented_response() -> None:
    obj = wire.message_object("m", answer(content="Hi! My name is Claude."), "msg_1")
    assert obj == {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "Hi! My name is Claude."}],
        "stop_reason": "end_turn", "stop_sequence": None,
        # Anthropic counts the tokens read from a cache apart from the input evaluated.
        "usage": {"input_tokens": 7, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 5, "output_tokens": 6},
    }  # fmt: skip


def test_message_object_thinking_and_tool_use() -> None:
    call = ToolCall("get_weather", {"location": "SF"}, "toolu_9")
    obj = wire.message_object("m", answer(thinking="hmm", tool_calls=(call,)))
    assert obj["id"].startswith("msg_")
    assert obj["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": ""},
        {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"location": "SF"}},
    ]
    assert obj["stop_reason"] == "tool_use"
    unnamed = wire.message_object("m", answer(tool_calls=(ToolCall("f", '{"a": 1}'),)))
    assert unnamed["content"][0]["id"].startswith("toolu_")
    assert unnamed["content"][0]["input"] == {"a": 1}


@pytest.mark.parametrize(
    ("done_reason", "sequence", "calls", "stop_reason"),
    [("stop", "", False, "end_turn"), ("length", "", False, "max_tokens"),
     ("stop", "", True, "tool_use"), ("stop", "END", False, "stop_sequence")],
)  # fmt: skip
def test_stop_reasons(done_reason: str, sequence: str, calls: bool, stop_reason: str) -> None:
    assert wire.stop_fields(done_reason, sequence, calls) == {
        "stop_reason": stop_reason, "stop_sequence": sequence or None,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (404, "not_found_error"), (413, "request_too_large"),
     (500, "api_error"), (503, "overloaded_error"), (502, "api_error")],
)  # fmt: skip
def test_error_object(status: int, kind: str) -> None:
    error = wire.error_object("no", status)
    request_id = error.pop("request_id")
    assert request_id.startswith("req_")
    assert len(bytes.fromhex(request_id[4:])) == 12  # 12 random bytes, as Ollama's
    assert request_id != wire.error_object("no", status)["request_id"]
    assert error == {
        "type": "error",
        "error": {"type": kind, "message": "no"},
    }


# -- the stream encoder --------------------------------------------------------------


def events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """``event: <type>`` / ``data: <json>`` pairs; the data's type names the event."""
    out = []
    for block in data.decode().removesuffix("\n\n").split("\n\n"):
        name, payload = block.split("\n")
        assert name.startswith("event: ")
        assert payload.startswith("data: ")
        parsed = json.loads(payload[6:])
        assert parsed["type"] == name[7:]
        out.append((name[7:], parsed))
    return out


def test_stream_events_in_anthropic_order() -> None:
    encoder = MessageEvents("m")
    gen: Any = None  # the encoder reads only the chunks
    first = encoder.encode([Chunk(thinking="let me "), Chunk(thinking="see")], gen)
    second = encoder.encode(
        [Chunk(content="It is"), Chunk(content=" sunny."),
         Chunk(tool_calls=[ToolCall("get_weather", {"location": "SF"}, "toolu_1")]),
         Chunk(done=True, done_reason="stop", prompt_eval_count=9, eval_count=4,
               prompt_cached_count=2)],
        gen,
    )  # fmt: skip
    seen = events(first + second)
    assert [kind for kind, _ in seen] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    start = seen[0][1]["message"]
    assert (start["id"], start["model"], start["content"]) == (encoder.id, "m", [])
    assert seen[2][1] == {"type": "content_block_start", "index": 0,
                          "content_block": {"type": "thinking", "thinking": "",
                                            "signature": ""}}  # fmt: skip
    assert seen[3][1]["delta"] == {"type": "thinking_delta", "thinking": "let me "}
    assert seen[6][1]["index"] == 1
    assert seen[7][1]["delta"] == {"type": "text_delta", "text": "It is"}
    assert seen[10][1]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "get_weather",
        "input": {},
    }
    assert seen[11][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"location":"SF"}'}
    assert seen[13][1] == {
        "type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"input_tokens": 7, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 2, "output_tokens": 4},
    }  # fmt: skip


def test_stream_of_nothing_has_one_empty_text_block() -> None:
    seen = events(MessageEvents("m").encode([Chunk(done=True, done_reason="length")], None))  # type: ignore[arg-type]
    assert [kind for kind, _ in seen] == [
        "message_start", "ping", "content_block_start", "content_block_stop", "message_delta",
        "message_stop",
    ]  # fmt: skip
    assert seen[4][1]["delta"]["stop_reason"] == "max_tokens"


def test_stream_error_event() -> None:
    ((kind, error),) = events(MessageEvents("m").error("queue full", 503))
    assert error.pop("request_id").startswith("req_")
    assert (kind, error) == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "queue full"}},
    )
