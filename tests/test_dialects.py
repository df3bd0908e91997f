"""The dialects' translations, without a server: native and OpenAI bodies into the core's
typed requests field by field, the folded answer, and the answer rendered by each dialect.
A field dropped on the way fails here."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from ollamatrio.api.native import wire as native_wire
from ollamatrio.api.native.stream import ChatLines, GenerateLines
from ollamatrio.api.openai import wire as oai
from ollamatrio.api.openai.stream import ChatEvents
from ollamatrio.api.pipeline import Embedded
from ollamatrio.errors import InvalidRequestError
from ollamatrio.generation.answer import Answer, Fold
from ollamatrio.generation.completion import chat_completion, generate_completion
from ollamatrio.generation.relay import Timings
from ollamatrio.generation.requests import (
    ChatRequest,
    EmbedRequest,
    GenerateRequest,
    Message,
    ToolCall,
)
from ollamatrio.types import Chunk

PNG = "iVBORw0KGgo="
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
TIMINGS = Timings(
    total_duration=9, load_duration=8, prompt_eval_count=7, prompt_eval_duration=6,
    eval_count=5, eval_duration=4, prompt_cached_count=3,
)  # fmt: skip
LOGPROB = {"token": "hi", "logprob": -0.5, "bytes": [104, 105]}


# -- native bodies -> the core ---------------------------------------------------------


def test_a_native_generate_body_fills_every_field() -> None:
    body = {
        "model": "m", "prompt": "p", "suffix": "s", "system": "sys", "template": "t",
        "context": [1, 2], "format": {"type": "object"}, "images": [PNG],
        "options": {"top_k": 3}, "keep_alive": "1m", "think": "high", "stream": False,
        "logprobs": True, "top_logprobs": 4, "shift": False, "truncate": False,
    }  # fmt: skip
    assert native_wire.generate_request(body) == GenerateRequest(
        model="m", prompt="p", suffix="s", system="sys", template="t", context=(1, 2),
        raw=False, format={"type": "object"}, images=(PNG,), options={"top_k": 3},
        keep_alive=60, think="high", stream=False, logprobs=True, top_logprobs=4,
        shift=False, truncate=False,
    )  # fmt: skip


def test_a_native_chat_body_fills_every_field() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "look", "images": [PNG]},
            {"role": "assistant", "content": "", "thinking": "hm", "tool_calls": [
                {"id": "c1", "function": {"index": 1, "name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "content": "42", "tool_name": "f", "tool_call_id": "c1",
             "ignored": True},
        ],
        "tools": [TOOL], "format": "json", "options": {"seed": 1}, "keep_alive": 0,
        "think": True, "stream": False, "logprobs": True, "top_logprobs": 2,
        "shift": True, "truncate": False,
    }  # fmt: skip
    assert native_wire.chat_request(body) == ChatRequest(
        model="m",
        messages=(
            Message(role="user", content="look", images=(PNG,)),
            Message(role="assistant", thinking="hm",
                    tool_calls=(ToolCall(name="f", arguments={"a": 1}, id="c1", index=1),)),
            Message(role="tool", content="42", tool_name="f", tool_call_id="c1"),
        ),
        tools=(TOOL,), format="json", options={"seed": 1}, keep_alive=0, think=True,
        stream=False, logprobs=True, top_logprobs=2, shift=True, truncate=False,
    )  # fmt: skip


def test_native_messages_go_back_to_the_engine_as_they_came() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "look", "images": [PNG]},
        {"role": "assistant", "content": "", "thinking": "hm",
         "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}, "id": "c1"}]},
        {"role": "tool", "content": "42", "tool_name": "f", "tool_call_id": "c1"},
    ]  # fmt: skip
    typed = native_wire.chat_request({"model": "m", "messages": messages}).messages
    assert [m.to_ollama() for m in typed] == messages


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ("f", "'messages[0].tool_calls[0]': expected an object"),
        ({"function": "f"}, "'messages[0].tool_calls[0].function': expected an object"),
        ({"function": {"name": 1}}, "'messages[0].tool_calls[0].function.name': expected a"),
        ({"function": {"arguments": 1}}, "tool_calls[0].function.arguments': expected an obj"),
        ({"id": 1, "function": {}}, "'messages[0].tool_calls[0].id': expected a string"),
    ],
    ids=["not-an-object", "function", "name", "arguments", "id"],
)
def test_native_tool_calls_are_checked(call: Any, error: str) -> None:
    body = {"model": "m", "messages": [{"role": "assistant", "tool_calls": [call]}]}
    with pytest.raises(InvalidRequestError, match=error.replace("[", r"\[").replace("]", r"\]")):
        native_wire.chat_request(body)


def test_native_tool_call_arguments_may_be_a_string_or_absent() -> None:
    calls = [{"function": {"name": "f", "arguments": "{oops"}}, {"function": {"name": "g"}}]
    body = {"model": "m", "messages": [{"role": "assistant", "tool_calls": calls}]}
    (message,) = native_wire.chat_request(body).messages
    assert message.tool_calls == (ToolCall("f", "{oops"), ToolCall("g", {}))


def test_native_embed_bodies() -> None:
    body = {"model": "m", "input": ["a", "b"], "truncate": False, "dimensions": 8,
            "options": {"num_ctx": 512}, "keep_alive": "5s"}  # fmt: skip
    assert native_wire.embed_request(body) == EmbedRequest(
        model="m", inputs=("a", "b"), truncate=False, dimensions=8,
        options={"num_ctx": 512}, keep_alive=5,
    )  # fmt: skip
    legacy = {"model": "m", "prompt": "a", "options": {"num_ctx": 512}, "keep_alive": 0}
    assert native_wire.embeddings_request(legacy) == EmbedRequest(
        model="m", inputs=("a",), options={"num_ctx": 512}, keep_alive=0
    )
    assert native_wire.embeddings_request({"model": "m"}).inputs == ()


# -- OpenAI bodies -> the core ---------------------------------------------------------


def test_an_openai_chat_body_fills_every_field() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [
                {"type": "text", "text": "what"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                {"type": "text", "text": "is this?"}]},
            {"role": "assistant", "content": None, "reasoning_content": "hm", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "f", "arguments": '{"a": 1}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
        "tools": [TOOL], "response_format": {"type": "json_object"},
        "reasoning": {"effort": "minimal"}, "stream": True,
        "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 3,
        "keep_alive": "1m", "temperature": 0.5, "max_tokens": 9, "stop": "END",
        "options": {"top_k": 2},
    }  # fmt: skip
    translated = oai.chat_request(body)
    assert translated.include_usage is True
    assert translated.core == ChatRequest(
        model="m",
        messages=(
            Message(role="system", content="be brief"),
            Message(role="user", content="what\nis this?", images=(PNG,)),
            Message(role="assistant", thinking="hm",
                    tool_calls=(ToolCall(name="f", arguments={"a": 1}, id="c1"),)),
            Message(role="tool", content="42", tool_name="f", tool_call_id="c1"),
        ),
        tools=(TOOL,), format="json", think="low", stream=True, logprobs=True,
        top_logprobs=3, keep_alive=60,
        options={"temperature": 0.5, "top_p": 1.0, "top_k": 2, "num_predict": 9,
                 "stop": ["END"]},
    )  # fmt: skip


def test_openai_chat_defaults() -> None:
    translated = oai.chat_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert translated.include_usage is False
    assert translated.core == ChatRequest(
        model="m", messages=(Message(role="user", content="hi"),), stream=False,
        options={"temperature": 1.0, "top_p": 1.0},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"messages": []}, "too short"),
        ({"n": 2}, "only n=1"),
        ({"top_logprobs": 30, "logprobs": True}, "between 0 and 20"),
        ({"options": {"top_k": "x"}}, "option top_k must be of type integer"),
        ({"tools": ["x"]}, "'tools': expected a list of objects"),
        ({"keep_alive": "soon"}, "invalid duration"),
        ({"stream_options": 1}, "stream_options"),
        ({"response_format": {"type": "xml"}}, "response_format type"),
        ({"reasoning_effort": "huge"}, "invalid reasoning value"),
    ],
    ids=["no-messages", "n", "top_logprobs", "options", "tools", "keep_alive",
         "stream_options", "response_format", "reasoning"],
)  # fmt: skip
def test_openai_chat_bodies_are_checked(extra: dict[str, Any], error: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    with pytest.raises(InvalidRequestError, match=error):
        oai.chat_request(body)


def test_an_openai_completion_body_fills_every_field() -> None:
    body = {"model": "m", "prompt": "def f(", "suffix": "return 1", "logprobs": 2,
            "stream": True, "stream_options": {"include_usage": True}, "keep_alive": 0,
            "seed": 5}  # fmt: skip
    translated = oai.completion_request(body)
    assert translated.include_usage is True
    assert translated.core == GenerateRequest(
        model="m", prompt="def f(", suffix="return 1", logprobs=True, top_logprobs=2,
        stream=True, keep_alive=0, options={"temperature": 1.0, "top_p": 1.0, "seed": 5},
    )  # fmt: skip
    with pytest.raises(InvalidRequestError, match="between 0 and 20"):
        oai.completion_request({"model": "m", "prompt": "p", "logprobs": 21})
    assert oai.completion_request({"model": "m", "logprobs": -1}).core.logprobs is False


def test_an_openai_embedding_body() -> None:
    translated = oai.embedding_request(
        {"model": "m", "input": ["a"], "dimensions": 4, "encoding_format": "BASE64"}
    )
    assert translated.core == EmbedRequest(model="m", inputs=("a",), dimensions=4)
    assert translated.encoding_format == "base64"


# -- the folded answer -----------------------------------------------------------------


def test_the_fold_keeps_every_part_of_a_generation() -> None:
    final = Chunk(done=True, done_reason="length", context=(1, 2), eval_count=5)
    gen: Any = SimpleNamespace(final=final, timings=lambda chunk: TIMINGS)  # a stand-in
    fold = Fold()
    fold.add([Chunk(content="Hel", thinking="hm", logprobs=[LOGPROB]), Chunk(content="lo")])
    fold.add([Chunk(tool_calls=[ToolCall("f", {"a": 1}, id="c")])])
    fold.add([final])
    assert fold.answer(gen) == Answer(
        content="Hello", thinking="hm", tool_calls=(ToolCall("f", {"a": 1}, id="c"),),
        logprobs=(LOGPROB,), done_reason="length", stop_sequence="", context=(1, 2),
        timings=TIMINGS,
    )  # fmt: skip


ANSWER = Answer(
    content="Hello", thinking="hm", tool_calls=(ToolCall("f", {"a": "é"}, id="c1"),),
    logprobs=(LOGPROB,), done_reason="stop", stop_sequence="", context=(1, 2),
    timings=TIMINGS,
)  # fmt: skip
NATIVE_FINAL = {
    "done": True, "done_reason": "stop", "context": [1, 2], "total_duration": 9,
    "load_duration": 8, "prompt_eval_count": 7, "prompt_eval_duration": 6, "eval_count": 5,
    "eval_duration": 4, "prompt_cached_count": 3, "logprobs": [LOGPROB],
}  # fmt: skip


def test_native_answers() -> None:
    generate = native_wire.generate_answer("m", ANSWER)
    assert generate.pop("created_at")
    assert list(generate) == ["model", "response", "thinking", *NATIVE_FINAL]
    assert generate == {"model": "m", "response": "Hello", "thinking": "hm", **NATIVE_FINAL}
    chat = native_wire.chat_answer("m", ANSWER)
    assert chat.pop("created_at")
    assert chat == {
        "model": "m",
        "message": {"role": "assistant", "content": "Hello", "thinking": "hm",
                    "tool_calls": [{"function": {"name": "f", "arguments": {"a": "é"}},
                                    "id": "c1"}]},
        **NATIVE_FINAL,
    }  # fmt: skip


def test_openai_answers() -> None:
    chat = oai.chat_completion("m", ANSWER)
    assert chat["object"] == "chat.completion"
    assert chat["model"] == "m"
    assert chat["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello", "reasoning": "hm",
                        "tool_calls": [{"id": "c1", "type": "function", "function": {
                            "name": "f", "arguments": '{"a":"é"}'}}]},
            "finish_reason": "tool_calls",
            "logprobs": {"content": [LOGPROB]},
        }
    ]  # fmt: skip
    # The whole prompt, as Ollama counts it; the part reused from the cache in the details.
    assert chat["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12,
                             "prompt_tokens_details": {"cached_tokens": 3}}  # fmt: skip
    text = oai.text_completion("m", ANSWER)
    assert text["object"] == "text_completion"
    assert text["choices"] == [
        {"text": "Hello", "index": 0, "finish_reason": "stop",
         "logprobs": {"content": [LOGPROB]}},
    ]  # fmt: skip
    assert text["usage"] == chat["usage"]


def test_openai_tool_calls_without_an_id_get_one() -> None:
    (call,) = oai.openai_tool_calls([ToolCall("f", "not json")], 3, stream=True)
    assert call["id"].startswith("call_")
    assert (call["index"], call["function"]) == (3, {"name": "f", "arguments": "not json"})


def test_embedding_answers() -> None:
    done = Embedded([[0.5, 0.25]], 3, 1.0, 2.0)
    assert native_wire.embed_answer("m", done) == {
        "model": "m", "embeddings": [[0.5, 0.25]], "total_duration": 2_000_000_000,
        "load_duration": 1_000_000_000, "prompt_eval_count": 3,
    }  # fmt: skip
    assert native_wire.embeddings_answer(done) == {"embedding": [0.5, 0.25]}
    assert native_wire.embeddings_answer(Embedded([], 0, 1.0, 1.0)) == {"embedding": []}


# -- the core -> the engine ------------------------------------------------------------


def _info(chat_template: str | None) -> Any:
    return SimpleNamespace(chat_template=chat_template)


def _model(**fields: Any) -> Any:
    return SimpleNamespace(
        **{"template": None, "system": None, "messages": (), "projectors": (), **fields}
    )


def test_a_chat_reaches_the_engine_as_typed_messages() -> None:
    req = ChatRequest(
        model="m",
        messages=(
            Message("user", "look", images=(PNG,)),
            Message("assistant", tool_calls=(ToolCall("f", {"a": 1}, id="c1"),)),
            Message("tool", "42", tool_name="f", tool_call_id="c1"),
        ),
        tools=(TOOL,), format="json", think="high", logprobs=True, top_logprobs=2,
        truncate=False,
    )  # fmt: skip
    model = _model(system="be brief", messages=({"role": "user", "content": "earlier"},))
    completion = chat_completion(req, model, _info("jinja"), {"seed": 1})
    assert completion.prompt is None
    assert completion.messages == [
        Message("system", "be brief"),
        Message("user", "earlier"),
        *req.messages,
    ]
    assert (completion.tools, completion.format, completion.think) == ([TOOL], "json", "high")
    assert (completion.logprobs, completion.top_logprobs, completion.truncate) == (True, 2, False)
    assert completion.options == {"seed": 1}
    assert (completion.images, completion.context, completion.return_context) == ((), (), False)


def test_a_generate_request_reaches_the_engine() -> None:
    req = GenerateRequest(
        model="m", prompt="p", system="s", images=(PNG,), context=(4,), format="json"
    )
    completion = generate_completion(req, _model(), _info("j"), {})
    assert completion.messages == [Message("system", "s"), Message("user", "p", images=(PNG,))]
    assert (completion.context, completion.return_context, completion.format) == (
        (4,), True, "json",
    )  # fmt: skip
    raw = GenerateRequest(model="m", prompt="<raw>", raw=True, images=(PNG,))
    completion = generate_completion(raw, _model(), _info("j"), {})
    assert (completion.prompt, completion.images, completion.return_context) == (
        "<raw>", (PNG,), False,
    )  # fmt: skip


def test_the_records_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Message("user").content = "x"  # type: ignore[misc]
    assert json.dumps(ToolCall("f").to_ollama()) == '{"function": {"name": "f", "arguments": {}}}'


def test_stored_messages_are_read_leniently_and_round_trip() -> None:
    stored = {
        "role": "assistant", "content": "sure", "thinking": "hm", "images": [PNG],
        "tool_calls": [{"function": {"index": 1, "name": "f", "arguments": {"a": 1}}, "id": "c"}],
        "tool_name": "", "tool_call_id": "",
    }  # fmt: skip
    message = Message.from_ollama(stored)
    assert message == Message(
        "assistant", "sure", thinking="hm", images=(PNG,),
        tool_calls=(ToolCall("f", {"a": 1}, id="c", index=1),),
    )  # fmt: skip
    assert Message.from_ollama(message.to_ollama()) == message
    odd = {"role": 1, "content": None, "images": "x", "tool_calls": [3, {"function": "f"}]}
    assert Message.from_ollama(odd) == Message("", tool_calls=(ToolCall(""),))


def test_a_go_template_sees_every_field_of_the_typed_messages() -> None:
    template = (
        "{{- range .Messages }}[{{ .Role }}|{{ .Content }}|{{ .Thinking }}"
        "{{- range .ToolCalls }}|{{ .ID }}:{{ .Function.Name }}{{ .Function.Arguments }}{{ end }}"
        "{{- if .ToolName }}|{{ .ToolName }}:{{ .ToolCallID }}{{ end }}]{{ end }}"
    )
    req = ChatRequest(
        model="m",
        messages=(
            Message("assistant", thinking="hm", tool_calls=(ToolCall("f", {"a": 1}, id="c1"),)),
            Message("tool", "42", tool_name="f", tool_call_id="c1"),
        ),
    )
    stored = ({"role": "user", "content": "earlier"},)
    completion = chat_completion(req, _model(template=template, messages=stored), _info(None), {})
    assert completion.messages is None
    assert completion.prompt == '[user|earlier|][assistant||hm|c1:f{"a":1}][tool|42||f:c1]'


def test_streamed_tool_calls_are_written_in_each_dialects_shape() -> None:
    gen: Any = SimpleNamespace()  # not asked: no chunk here is the final one
    calls = [ToolCall("f", {"a": 1}, id="c1"), ToolCall("g", "{x", index=1)]
    (line,) = ChatLines("m").encode([Chunk(tool_calls=calls)], gen).splitlines()
    assert json.loads(line)["message"] == {
        "role": "assistant", "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}, "id": "c1"},
                       {"function": {"name": "g", "arguments": "{x", "index": 1}}],
    }  # fmt: skip
    event = ChatEvents("m", include_usage=False).encode([Chunk(tool_calls=calls)], gen)
    delta = json.loads(event.removeprefix(b"data: "))["choices"][0]["delta"]
    assert delta["tool_calls"] == [
        {"id": "c1", "index": 0, "type": "function",
         "function": {"name": "f", "arguments": '{"a":1}'}},
        {"id": delta["tool_calls"][1]["id"], "index": 1, "type": "function",
         "function": {"name": "g", "arguments": "{x"}},
    ]  # fmt: skip


def test_native_load_lines_are_shaped_like_their_streams_lines() -> None:
    for lines, body in [
        (GenerateLines("m"), b'"response":""'),
        (ChatLines("m"), b'"message":{"role":"assistant","content":""}'),
    ]:
        line = lines.load_line(1, 2)
        assert line.startswith(b'{"model":"m","created_at":"')
        stamp, rest = line.removeprefix(b'{"model":"m","created_at":"').split(b'",', 1)
        assert stamp.endswith(b"Z") or b"+" in stamp or b"-" in stamp[10:]
        assert rest == body + b',"done":false,"load_progress":{"completed":1,"total":2}}\n'
