"""The Responses dialect's pure translations, as tables from OpenAI's documented examples,
and the SQLite store on its own (retention, pruning, where it lives)."""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from ollamatrio.api.responses import wire
from ollamatrio.api.responses.store import ResponseStore
from ollamatrio.config import Settings
from ollamatrio.errors import InvalidRequestError, ResponseNotFoundError
from ollamatrio.generation.answer import Answer
from ollamatrio.generation.relay import Timings
from ollamatrio.generation.requests import Message, ToolCall

PNG = "iVBORw0KGgo="
CALL = {
    "type": "function_call",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city":"Paris"}',
}
WEATHER_CALL = ToolCall("get_weather", {"city": "Paris"}, id="call_1")


@pytest.mark.parametrize(
    ("body", "messages"),
    [
        pytest.param(
            {"input": "Tell me a story."},
            (Message(role="user", content="Tell me a story."),),
            id="string",
        ),
        pytest.param(
            {"input": "hi", "instructions": "Talk like a pirate."},
            (
                Message(role="system", content="Talk like a pirate."),
                Message(role="user", content="hi"),
            ),
            id="instructions",
        ),
        pytest.param(
            {
                "input": [
                    {"role": "developer", "content": "be brief"},
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "what is in this image?"},
                            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
                        ],
                    },
                ]
            },
            (
                Message(role="system", content="be brief"),
                Message(role="user", content="what is in this image?", images=(PNG,)),
            ),
            id="parts-and-image",
        ),
        pytest.param(
            {
                "input": [
                    {"role": "user", "content": "weather?"},
                    {
                        "type": "reasoning",
                        "summary": [{"type": "summary_text", "text": "look it up"}],
                    },
                    CALL,
                    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                ]
            },
            (
                Message(role="user", content="weather?"),
                Message(role="assistant", thinking="look it up", tool_calls=(WEATHER_CALL,)),
                Message(
                    role="tool", content="sunny", tool_name="get_weather", tool_call_id="call_1"
                ),
            ),
            id="tool-history",
        ),
        pytest.param(
            {
                "input": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "Let me check."}],
                    },
                    CALL,
                    {**CALL, "call_id": "call_2"},
                ]
            },
            (
                Message(
                    role="assistant",
                    content="Let me check.",
                    tool_calls=(
                        WEATHER_CALL,
                        ToolCall("get_weather", {"city": "Paris"}, id="call_2"),
                    ),
                ),
            ),
            id="calls-join-the-assistant-message",
        ),
    ],
)
def test_input_items(body: dict[str, Any], messages: tuple[Message, ...]) -> None:
    req = wire.chat_request(wire.responses_call({"model": "m", **body}))
    assert req.messages == messages


def test_fields() -> None:
    call = wire.responses_call(
        {
            "model": "m",
            "input": "x",
            "temperature": 0.2,
            "top_p": 0.5,
            "max_output_tokens": 64,
            "reasoning": {"effort": "high"},
            "stream": True,
            "store": False,
            "tools": [
                {"type": "function", "name": "f", "parameters": {"type": "object"}},
                {"type": "web_search"},
            ],
            "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
            "previous_response_id": "resp_1",
        }
    )
    req = wire.chat_request(call)
    assert dict(req.options) == {"temperature": 0.2, "top_p": 0.5, "num_predict": 64}
    assert req.think == "high"
    assert req.stream
    assert not call.store
    assert call.previous_response_id == "resp_1"
    assert req.tools == (
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
    )
    assert req.format == {"type": "object"}
    assert wire.responses_call({"model": "m", "input": "x"}).store  # default: stored
    none = wire.responses_call(
        {
            "model": "m",
            "input": "x",
            "tools": [{"type": "function", "name": "f"}],
            "tool_choice": "none",
        }
    )
    assert wire.chat_request(none).tools == ()


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"input": 3}, "expected a string or a list"),
        ({"input": [{"type": "computer_call"}]}, "unsupported input item type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "unsupported content part",
        ),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_image", "image_url": "data:image/png;base64,@@"}
                        ],
                    }
                ]
            },
            "invalid image input",
        ),
        ({"input": [{**CALL, "arguments": "{not json"}]}, "invalid function_call arguments"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "call_id is required"),
        ({"input": "x", "reasoning": {"effort": "huge"}}, "invalid reasoning value"),
        ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
        ({"input": []}, "input is required"),
    ],
)
def test_invalid_bodies(body: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidRequestError, match=error):
        wire.chat_request(wire.responses_call({"model": "m", **body}))


def answer(
    content: str = "", thinking: str = "", calls: tuple[ToolCall, ...] = (), reason: str = "stop"
) -> Answer:
    return Answer(
        content=content,
        thinking=thinking,
        tool_calls=calls,
        logprobs=(),
        done_reason=reason,
        stop_sequence="",
        context=(),
        timings=Timings(0, 0, 7, 0, 5, 0, prompt_cached_count=4),
    )


def test_response_objects() -> None:
    draft = wire.Draft(wire.responses_call({"model": "m", "input": "x", "metadata": {"k": "v"}}))
    done = wire.response_object(draft, answer("Hi", "hmm", (WEATHER_CALL,)))
    assert done["status"] == "completed"
    assert done["metadata"] == {"k": "v"}
    assert [item["type"] for item in done["output"]] == ["reasoning", "message", "function_call"]
    assert done["output"][0]["summary"] == [{"type": "summary_text", "text": "hmm"}]
    assert done["output"][1]["content"][0]["text"] == "Hi"
    assert done["output"][2]["arguments"] == '{"city":"Paris"}'
    assert done["output"][2]["call_id"] == "call_1"
    assert done["usage"]["input_tokens"] == 7  # the whole prompt
    assert done["usage"]["input_tokens_details"] == {"cached_tokens": 4}
    assert done["usage"]["total_tokens"] == 12
    assert done["completed_at"] >= done["created_at"]
    # The fields of OpenAI's Response object this server does not take, as Ollama fills them.
    defaults = {"background": False, "service_tier": "default", "top_logprobs": 0}
    assert {k: done[k] for k in defaults} == defaults
    cut = wire.response_object(draft, answer("Hi", reason="length"))
    assert cut["status"] == "incomplete"
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut["completed_at"] is None
    only_call = wire.response_object(draft, answer(calls=(ToolCall("f", {}),)))
    assert [item["type"] for item in only_call["output"]] == ["function_call"]
    assert only_call["output"][0]["call_id"] == draft.item_id("call", 0)


def test_input_items_page() -> None:
    items = [{"id": f"msg_{n}"} for n in range(5)]
    page = wire.input_items_page(items, order="desc", limit=2, after="")
    assert [i["id"] for i in page["data"]] == ["msg_4", "msg_3"]
    assert page["has_more"]
    rest = wire.input_items_page(items, order="asc", limit=10, after="msg_2")
    assert [i["id"] for i in rest["data"]] == ["msg_3", "msg_4"]
    assert not rest["has_more"]


# -- the store -------------------------------------------------------------------------


def test_store_retention_and_pruning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ResponseStore(tmp_path / "state" / "responses.sqlite3", ttl=60.0)
    store.put({"id": "resp_a", "output": [{"id": "msg_o"}]}, [{"id": "msg_i"}], [{"id": "msg_i"}])
    got = store.get("resp_a")
    assert got.input == [{"id": "msg_i"}]
    assert got.history() == [{"id": "msg_i"}, {"id": "msg_o"}]
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    later = time.time() + 61
    monkeypatch.setattr("ollamatrio.api.responses.store.time.time", lambda: later)
    with pytest.raises(ResponseNotFoundError):
        store.get("resp_a")  # expired: gone before it is pruned
    assert store.prune() == 1
    assert store.prune() == 0
    forever = ResponseStore(store.path, ttl=math.inf)
    forever.put({"id": "resp_b"}, [], [])
    assert forever.prune(now=later + 1e9) == 0
    forever.delete("resp_b")
    with pytest.raises(ResponseNotFoundError):
        forever.delete("resp_b")


def test_where_the_state_lives(tmp_path: Path) -> None:
    models = tmp_path / "models"
    assert Settings(models_dir=models).state_dir == tmp_path / "ollamatrio"
    env = {
        "OLLAMA_MODELS": str(models),
        "OLLAMATRIO_DATA": str(tmp_path / "data"),
        "OLLAMATRIO_RESPONSES_TTL": "1h",
    }
    settings = Settings.from_env(env)
    assert settings.state_dir == tmp_path / "data"
    assert settings.responses_ttl == 3600
    assert Settings.from_env({"OLLAMA_MODELS": str(models)}).responses_ttl == 30 * 24 * 3600
    assert Settings.from_env({"OLLAMATRIO_RESPONSES_TTL": "0"}).responses_ttl == math.inf
