"""The runner client: request/response translation, and real runners on tiny models."""

from __future__ import annotations

import math
import os
import signal
import stat
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from helpers.runner_process import RawRunner, start_raw_runner

from ollamatrio.config import Settings
from ollamatrio.engines.chunk_stream import ChunkStream, stall_guard
from ollamatrio.engines.llamacpp_wire import (
    ChatStream,
    CompletionStream,
    chat_message,
    chat_request,
    completion_request,
    embedding_vectors,
    n_predict,
    parse_sse_line,
    sampling_fields,
    timing_counts,
)
from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.engines.runner_client import RunnerClient, open_runner_http
from ollamatrio.engines.runner_http import parse_event
from ollamatrio.errors import (
    CapabilityError,
    InvalidRequestError,
    RunnerCrashedError,
    RunnerError,
    RunnerStartError,
)
from ollamatrio.types import Chunk, CompletionRequest, LoadSpec, Message, ToolCall, ToolCallDelta

TinyGGUF = Callable[..., Path]
GREEDY = {"temperature": 0, "seed": 42}

# -- translation (pure) --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_predict", "expected"),
    [(None, 5120), (-1, 5120), (-2, 5120), (0, 0), (100, 100), (5120, 5120), (6000, 5120)],
)
def test_num_predict_is_capped_at_ten_contexts(num_predict: int | None, expected: int) -> None:
    assert n_predict({"num_predict": num_predict}, 512) == expected


def test_sampling_fields_send_every_option_with_ollamas_defaults() -> None:
    body = sampling_fields({}, 2048)
    assert body == {
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.9,
        "min_p": 0.0,
        "typical_p": 1.0,
        "repeat_last_n": 64,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "seed": -1,
        "n_keep": 4,
        "n_predict": 20480,
        "cache_prompt": True,
        "stream": True,
    }


@pytest.mark.parametrize(
    ("options", "field", "value"),
    [
        ({"num_predict": 7}, "n_predict", 7),
        ({"temperature": 0}, "temperature", 0),
        ({"top_k": 1}, "top_k", 1),
        ({"top_p": 0.5}, "top_p", 0.5),
        ({"min_p": 0.1}, "min_p", 0.1),
        ({"typical_p": 0.7}, "typical_p", 0.7),
        ({"repeat_last_n": -1}, "repeat_last_n", -1),
        ({"repeat_penalty": 1.3}, "repeat_penalty", 1.3),
        ({"presence_penalty": 0.2}, "presence_penalty", 0.2),
        ({"frequency_penalty": 0.3}, "frequency_penalty", 0.3),
        ({"seed": 7}, "seed", 7),
        ({"num_keep": 0}, "n_keep", 0),
        ({"stop": "\n"}, "stop", ["\n"]),
        ({"stop": ["a", "b"]}, "stop", ["a", "b"]),
        ({"ignore_eos": True}, "ignore_eos", True),
        ({"logit_bias": [[2, False]]}, "logit_bias", [[2, False]]),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else None,
)
def test_sampling_option_mapping(options: dict[str, Any], field: str, value: Any) -> None:
    assert sampling_fields(options, 2048)[field] == value


@pytest.mark.parametrize(
    ("request_", "path", "fields"),
    [
        (CompletionRequest(prompt="hi"), "/completion", {"prompt": "hi"}),
        (
            CompletionRequest(prompt="hi", format="json"),
            "/completion",
            {"json_schema": {"type": "object"}},
        ),
        (
            CompletionRequest(prompt="hi", format={"type": "array"}),
            "/completion",
            {"json_schema": {"type": "array"}},
        ),
        (
            CompletionRequest(prompt="def f(", suffix="return 1"),
            "/infill",
            {"input_prefix": "def f(", "input_suffix": "return 1", "prompt": ""},
        ),
    ],
    ids=["plain", "json", "schema", "suffix"],
)
def test_completion_request(request_: CompletionRequest, path: str, fields: dict[str, Any]) -> None:
    got_path, body = completion_request(request_, 2048)
    assert got_path == path
    assert fields.items() <= body.items()


@pytest.mark.parametrize(
    ("request_", "fields"),
    [
        (
            CompletionRequest(messages=[], format="json"),
            {"response_format": {"type": "json_object"}},
        ),
        (
            CompletionRequest(messages=[], format={"type": "object"}),
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "object"}},
                }
            },
        ),
        (
            CompletionRequest(messages=[], think=True),
            {"chat_template_kwargs": {"enable_thinking": True}},
        ),
        (
            CompletionRequest(messages=[], think=False),
            {"chat_template_kwargs": {"enable_thinking": False}},
        ),
        (
            CompletionRequest(messages=[], think="high"),
            {"chat_template_kwargs": {"enable_thinking": True, "reasoning_effort": "high"}},
        ),
        (
            CompletionRequest(messages=[], tools=[{"type": "function", "function": {"name": "f"}}]),
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
        ),
    ],
    ids=["json", "schema", "think", "no-think", "think-level", "tools"],
)
def test_chat_request(request_: CompletionRequest, fields: dict[str, Any]) -> None:
    path, body = chat_request(request_, 2048, "tiny")
    assert path == "/v1/chat/completions"
    assert fields.items() <= body.items()
    assert body["model"] == "tiny"


def test_bad_format_is_rejected() -> None:
    with pytest.raises(InvalidRequestError):
        completion_request(CompletionRequest(prompt="x", format="yaml"), 2048)


PNG, JPEG = "iVBORw0KGgo=", "/9j/4AAQSkZJRg=="


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (Message("user", "hi"), {"role": "user", "content": "hi"}),
        (
            Message("user", "see", images=("iVBORw0KGgo=",)),
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "see"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
                    },
                ],
            },
        ),
        (
            Message("user", images=(PNG, JPEG)),
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                    {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{JPEG}"}},
                ],
            },
        ),
        (
            Message("assistant", thinking="hmm", tool_calls=(ToolCall("f", {"x": 1}),)),
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "hmm",
                "tool_calls": [
                    {
                        "id": "call_0_0",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"x": 1}'},
                    }
                ],
            },
        ),
        (
            Message(
                "assistant", "let me see",
                tool_calls=(ToolCall("f", {"x": 1}, id="c1", index=0), ToolCall("g", "{raw")),
            ),
            {
                "role": "assistant",
                "content": "let me see",
                "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "f", "arguments": '{"x": 1}'}},
                    {"id": "call_0_1", "type": "function",
                     "function": {"name": "g", "arguments": "{raw"}},
                ],
            },
        ),
        (
            Message("tool", "42", tool_name="f"),
            {"role": "tool", "content": "42", "name": "f"},
        ),
        (
            Message("tool", "42", tool_name="f", tool_call_id="c1"),
            {"role": "tool", "content": "42", "name": "f", "tool_call_id": "c1"},
        ),
        # Tool fields belong to tool results only.
        (Message("user", "hi", tool_name="f"), {"role": "user", "content": "hi"}),
        (Message("", "hi"), {"role": "user", "content": "hi"}),
    ],
    ids=[
        "text", "image", "images-only", "assistant-tool-call", "tool-calls-with-ids",
        "tool-result", "tool-result-with-id", "tool-name-elsewhere", "no-role",
    ],
)  # fmt: skip
def test_chat_message_translation(message: Message, expected: dict[str, Any]) -> None:
    assert chat_message(message) == expected


def test_tool_call_ids_name_their_message() -> None:
    history = [Message("user", "hi"), Message("assistant", tool_calls=(ToolCall("f"),) * 2)]
    _, body = chat_request(CompletionRequest(messages=history), 2048, "m")
    ids = [call["id"] for call in body["messages"][1]["tool_calls"]]
    assert ids == ["call_1_0", "call_1_1"]
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == "{}"


TIMINGS = {"prompt_n": 5, "prompt_ms": 1.5, "predicted_n": 3, "predicted_ms": 30.25, "cache_n": 40}


def test_timing_counts_are_nanoseconds() -> None:
    # llama.cpp's prompt_n is what it evaluated, cache_n what it reused: Ollama's count is
    # the whole prompt, the duration that of the evaluated part.
    assert timing_counts(TIMINGS) == {
        "prompt_eval_count": 45,
        "prompt_eval_duration": 1_500_000,
        "prompt_cached_count": 40,
        "eval_count": 3,
        "eval_duration": 30_250_000,
        "draft_count": None,  # a runner that drafts nothing reports no draft counts
        "draft_accepted_count": None,
    }


@pytest.mark.parametrize(
    ("stop_type", "reason"), [("limit", "length"), ("eos", "stop"), ("word", "stop")]
)
def test_completion_stream(stop_type: str, reason: str) -> None:
    stream = CompletionStream()
    assert stream.feed({"content": "a", "stop": False}) == [Chunk(content="a")]
    assert stream.feed({"content": "", "stop": False}) == []
    final = stream.feed({
        "content": "", "stop": True, "stop_type": stop_type, "timings": TIMINGS,
        "stopping_word": "END" if stop_type == "word" else "",
    })  # fmt: skip
    word = "END" if stop_type == "word" else ""
    assert final == [
        Chunk(done=True, done_reason=reason, stop_sequence=word, **timing_counts(TIMINGS))
    ]
    assert stream.done


@pytest.mark.parametrize(
    ("pieces", "sent", "matched"),
    [
        (["Hello", " wor", "ld"], "Hello world", ""),  # no match: everything, held tail too
        (["1, 2, 3", ", 4, 5"], "1, 2, 3, 4, ", "5"),
        (["ab", "cST", "OPde"], "abc", "STOP"),  # split over pieces: held, then dropped
        (["xS", "Ty"], "xSTy", ""),  # a held prefix that did not become a match
        (["a END b STOP"], "a ", "END"),  # the first match in the text wins
        (["a5STOP"], "a", "5"),
    ],
)
def test_chat_stream_matches_stop_sequences(pieces: list[str], sent: str, matched: str) -> None:
    """llama.cpp's chat stream cannot say which sequence stopped it, so they are matched
    here: the text up to the match, the match itself on the final chunk, counts from the
    last timings seen (the request asks for them on every event)."""
    stream = ChatStream(stop=("STOP", "5", "END"))
    chunks = []
    for piece in pieces:
        chunks += stream.feed({"choices": [{"delta": {"content": piece}}], "timings": TIMINGS})
        if stream.done:
            break
    if not stream.done:
        chunks += stream.feed({"choices": [{"delta": {}, "finish_reason": "stop"}]})
        chunks += stream.finish()
    assert "".join(c.content for c in chunks) == sent
    assert chunks[-1] == Chunk(
        done=True, done_reason="stop", stop_sequence=matched, **timing_counts(TIMINGS)
    )
    assert stream.feed({"choices": [{"delta": {"content": "more"}}]}) == []


def test_a_chat_that_reports_its_stop_sequence_matches_them_itself() -> None:
    """Only a request whose dialect names the matched sequence leaves the sequences out of
    llama.cpp's request (and asks for timings on every event, for the counts at a match);
    the others keep llama.cpp's own stopping."""
    request = CompletionRequest(messages=[], options={"stop": ["x"]})
    _, plain = chat_request(request, 2048, "m")
    assert plain["stop"] == ["x"]
    assert "timings_per_token" not in plain
    _, reporting = chat_request(replace(request, report_stop=True), 2048, "m")
    assert "stop" not in reporting
    assert reporting["timings_per_token"] is True


def test_chat_stream_joins_tool_call_deltas() -> None:
    stream = ChatStream()
    events = [
        {"choices": [{"delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"delta": {"reasoning_content": "think"}}]},
        {"choices": [{"delta": {"content": "Hi"}}]},
        {
            "choices": [
                {"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get"}}]}}
            ]
        },
        {
            "choices": [
                {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}}
            ]
        },
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}], "timings": TIMINGS},
    ]
    chunks = [chunk for event in events for chunk in stream.feed(event)]
    assert chunks == [
        Chunk(thinking="think"), Chunk(content="Hi"),
        Chunk(tool_call_deltas=[ToolCallDelta(0, "c1", "get")]),
        Chunk(tool_call_deltas=[ToolCallDelta(0, arguments='{"a":')]),
        Chunk(tool_call_deltas=[ToolCallDelta(0, arguments=" 1}")]),
    ]  # fmt: skip
    assert not stream.done
    assert stream.finish() == [
        Chunk(tool_calls=[ToolCall("get", {"a": 1}, id="c1")]),
        Chunk(done=True, done_reason="stop", **timing_counts(TIMINGS)),
    ]


def test_chat_stream_tool_calls_become_records_in_their_order() -> None:
    """Several calls, their deltas interleaved; a call without id or arguments gets empty
    ones; calls whose arguments are not a JSON object come back as the text the model
    wrote, counted as malformed (engines/forced_call.py)."""
    stream = ChatStream()

    def delta(*calls: dict[str, Any]) -> dict[str, Any]:
        return {"choices": [{"delta": {"tool_calls": list(calls)}}]}

    events = [
        delta({"index": 1, "id": "b", "function": {"name": "second", "arguments": "{oops"}}),
        delta({"index": 0, "function": {"name": "first"}}),
        delta({"index": 2, "id": "c", "function": {"name": "third", "arguments": "[1, 2]"}}),
        delta({"index": 1, "function": {"arguments": "}"}}),
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    ]
    chunks = [chunk for event in events for chunk in stream.feed(event)]
    assert [delta.index for chunk in chunks for delta in chunk.tool_call_deltas] == [1, 0, 2, 1]
    text, calls, final = stream.finish()
    assert text.content == (
        '{"name": "second", "arguments": {oops}}\n{"name": "third", "arguments": [1, 2]}'
    )
    assert calls.tool_calls == [ToolCall("first", {})]
    assert final.done
    assert final.malformed_tool_calls == 2


@pytest.mark.parametrize(
    ("line", "event"),
    [
        ('data: {"a": 1}', {"a": 1}),
        ("data: [DONE]", None),
        ("", None),
        (": keep-alive", None),
        ('error: {"message": "bad", "code": 400}', {"error": {"message": "bad", "code": 400}}),
    ],
)
def test_parse_sse_line(line: str, event: dict[str, Any] | None) -> None:
    assert parse_sse_line(line) == event


def test_embedding_vectors_are_ordered_truncated_and_normalised() -> None:
    response = {
        "data": [{"index": 1, "embedding": [0.0, 3.0, 4.0]}, {"index": 0, "embedding": [2.0, 0, 0]}]
    }
    assert embedding_vectors(response, 2) == [[1.0, 0.0, 0.0], [0.0, 0.6, 0.8]]
    assert embedding_vectors(response, 2, dimensions=2) == [[1.0, 0.0], [0.0, 1.0]]


# -- a shared runner on a tiny model -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RawRunner]:
    from ollamatrio.testing import write_tiny_gguf

    model = write_tiny_gguf(tmp_path_factory.mktemp("shared") / "tiny.gguf", ctx=4096)
    spec = LoadSpec(
        model_path=str(model),
        name="tiny",
        num_ctx=2048,
        num_parallel=2,
        num_thread=1,
        embedding=True,
    )
    runner = start_raw_runner(spec)
    assert runner.ready["event"] == "ready", runner.ready
    yield runner
    runner.stop()


@pytest.fixture
async def client(tiny_runner: RawRunner) -> AsyncIterator[RunnerClient]:
    async with open_runner_http(tiny_runner.socket, tiny_runner.config.api_key) as http:
        yield RunnerClient(
            name="tiny",
            context_length=tiny_runner.ready["context_length"],
            num_parallel=2,
            http=http,
        )


async def collect(client: RunnerClient, request: CompletionRequest) -> list[Chunk]:
    async with client.complete(request) as stream:
        return [chunk async for chunk in stream]


async def test_generate_exactly_n_tokens(client: RunnerClient) -> None:
    request = CompletionRequest(
        prompt="hello", options={**GREEDY, "num_predict": 12, "ignore_eos": True}
    )
    with trio.fail_after(30):
        chunks = await collect(client, request)
        again = await collect(client, request)
    final = chunks[-1]
    assert final.done
    assert final.done_reason == "length"
    assert final.eval_count == 12
    assert final.eval_duration > 0
    assert not any(chunk.done for chunk in chunks[:-1])
    assert "".join(c.content for c in chunks) == "".join(c.content for c in again)  # greedy


async def test_chat_streams_and_counts(client: RunnerClient) -> None:
    request = CompletionRequest(
        messages=[Message("system", "be brief"), Message("user", "hi")],
        options={**GREEDY, "num_predict": 6, "ignore_eos": True},
    )
    with trio.fail_after(30):
        chunks = await collect(client, request)
    final = chunks[-1]
    assert final.done
    assert final.done_reason == "length"
    assert final.eval_count == 6
    assert final.prompt_eval_count > 0
    assert sum(1 for c in chunks if c.content) >= 1


async def test_tokenize_round_trip(client: RunnerClient) -> None:
    with trio.fail_after(10):
        tokens = await client.tokenize("the cat is here")
        text = await client.detokenize(tokens)
    assert tokens
    assert all(isinstance(t, int) for t in tokens)
    assert text.strip() == "the cat is here"


async def test_embeddings_are_normalised(client: RunnerClient) -> None:
    with trio.fail_after(10):
        full = await client.embed(["the cat", "is here", "the cat"])
        short = await client.embed(["the cat"], dimensions=16)
    assert len(full.vectors) == 3
    assert {len(v) for v in full.vectors} == {64}
    assert full.vectors[0] == pytest.approx(full.vectors[2], abs=1e-6)
    assert full.prompt_eval_count > 0
    for vector in [*full.vectors, *short.vectors]:
        assert math.fsum(x * x for x in vector) == pytest.approx(1.0)
    assert len(short.vectors[0]) == 16


async def test_context_overflow_is_a_request_error(client: RunnerClient) -> None:
    request = CompletionRequest(prompt="the " * 3000, options={"num_predict": 1})
    with trio.fail_after(30), pytest.raises(InvalidRequestError, match="context"):
        await collect(client, request)


async def test_cancel_mid_stream_frees_the_slot(client: RunnerClient) -> None:
    request = CompletionRequest(
        prompt="hello", options={**GREEDY, "num_predict": 4000, "ignore_eos": True}
    )
    with trio.fail_after(30):
        with trio.move_on_after(5) as scope:
            async with client.complete(request) as stream:
                received = 0
                async for _ in stream:
                    received += 1
                    if received == 3:
                        assert await busy_slots(client) == 1
                        scope.cancel()
        assert scope.cancelled_caught
        assert await wait_for_idle_slots(client) < 1.0


async def test_cancelling_a_stream_on_a_reused_connection_frees_the_slot(
    client: RunnerClient,
) -> None:
    request = CompletionRequest(
        prompt="hello", options={**GREEDY, "num_predict": 4000, "ignore_eos": True}
    )
    with trio.fail_after(30):
        assert await client.tokenize("hello")  # leaves an idle keep-alive connection
        opened = client.http.connections_opened
        with trio.move_on_after(5) as scope:
            async with client.complete(request) as stream:
                assert client.http.connections_opened == opened  # the stream reused it
                received = 0
                async for _ in stream:
                    received += 1
                    if received == 3:
                        scope.cancel()
        assert scope.cancelled_caught
        assert await wait_for_idle_slots(client) < 0.1


async def busy_slots(client: RunnerClient) -> int:
    return sum(1 for slot in await client.slots() if slot["is_processing"])


async def wait_for_idle_slots(client: RunnerClient) -> float:
    """Seconds until llama.cpp reports no busy slot (polled: the runner has no push)."""
    start = trio.current_time()
    for _ in range(200):
        if await busy_slots(client) == 0:
            break
        await trio.sleep(0.01)
    return trio.current_time() - start


async def test_healthy(client: RunnerClient) -> None:
    with trio.fail_after(10):
        assert await client.healthy()


# -- the factory: process lifetime ---------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "load_timeout", "verbosity"),
    [
        ({}, 300.0, 1),
        ({"OLLAMA_LOAD_TIMEOUT": "0"}, math.inf, 1),
        ({"OLLAMA_LOAD_TIMEOUT": "10s", "OLLAMA_DEBUG": "1"}, 10.0, 3),
    ],
    ids=["defaults", "no-load-timeout", "debug"],
)
def test_factory_takes_its_settings(
    env: dict[str, str], load_timeout: float, verbosity: int
) -> None:
    factory = ProcessEngineFactory(Settings.from_env(env))
    assert (factory.load_timeout, factory.verbosity) == (load_timeout, verbosity)
    assert ProcessEngineFactory(Settings.from_env(env), load_timeout=1).load_timeout == 1


async def test_open_loads_serves_and_closes(tiny_gguf: TinyGGUF) -> None:
    model = tiny_gguf()
    factory = ProcessEngineFactory(kill_grace=2.0)
    seen: dict[str, Any] = {}

    async def use_engine() -> None:
        spec = LoadSpec(model_path=str(model), name="tiny", num_ctx=512)
        async with factory.open(spec) as engine:
            seen["pid"] = engine.pid
            seen["socket_dir"] = socket_dir = os.path.dirname(engine.ready.socket)
            assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o700
            assert engine.context_length == 512
            assert engine.memory.total == engine.ready.memory.rss
            assert engine.memory.vram_by_gpu == {}
            assert await engine.healthy()
            # The model's own (ChatML) template renders the messages: the prompt llama.cpp
            # evaluated is exactly the rendered conversation plus BOS.
            rendered = "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
            expected = len(await engine.tokenize(rendered)) + 1
            request = CompletionRequest(
                messages=[Message("user", "hi there")], options={"num_predict": 2}
            )
            async with engine.complete(request) as stream:
                final = [chunk async for chunk in stream][-1]
            assert final.prompt_eval_count == expected
            with pytest.raises(CapabilityError):
                await engine.embed(["x"])
            raise LookupError("the body's own error")  # must come out as is, not in a group

    with trio.fail_after(60), pytest.raises(LookupError, match="the body's own error"):
        await use_engine()
    pid = seen["pid"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not await trio.Path(seen["socket_dir"]).exists()


async def test_closing_a_stopped_runner_does_not_wait_out_the_grace(tiny_gguf: TinyGGUF) -> None:
    """SIGTERM stays pending on a stopped (SIGSTOP) process; SIGCONT with it lets the runner
    leave cleanly at once instead of being SIGKILLed after the grace period."""
    factory = ProcessEngineFactory(kill_grace=30.0)
    with trio.fail_after(60):
        async with factory.open(LoadSpec(model_path=str(tiny_gguf()), name="t")) as engine:
            folder = os.path.dirname(engine.ready.socket)
            assert engine.pid is not None
            os.kill(engine.pid, signal.SIGSTOP)
            closing = trio.current_time()
    assert trio.current_time() - closing < 5
    assert engine.returncode == 0  # its own clean exit, not SIGKILL
    assert not await trio.Path(folder).exists()


class ScriptedEvents:
    """An event source fed by an async iterator of SSE bytes: one item, one wake-up."""

    def __init__(self, source: AsyncIterator[bytes]) -> None:
        self._source = source

    async def next_batch(self) -> list[dict[str, Any]]:
        try:
            data = await self._source.__anext__()
        except StopAsyncIteration:
            return []
        events = (parse_event(raw) for raw in data.split(b"\n\n") if raw.strip())
        return [e for e in events if e is not None]


async def test_a_silent_stream_fails_after_the_stall_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b'data: {"content": "Hello", "stop": false}\n\n'
        await trio.sleep(299)
        yield b'data: {"content": " there", "stop": false}\n\n'
        await trio.sleep(301)
        yield b'data: {"content": "!", "stop": true}\n\n'

    client = RunnerClient(name="t", context_length=2048, stall_timeout=300)
    seen = []
    with pytest.raises(RunnerError, match="stopped responding: no output for 300s"):
        async with aclosing(body()) as source, stall_guard(client) as stall:
            stream = ChunkStream(client, ScriptedEvents(source), CompletionStream(), None, stall)
            async for chunk in stream:
                seen.append(chunk.content)
                await trio.sleep(1000)  # the consumer's own time is not the runner's silence
    assert seen == ["Hello", " there"]  # 299 s of silence is allowed
    assert trio.current_time() == 2599


async def test_duplicate_tokens_abort_is_reported(tiny_gguf: TinyGGUF) -> None:
    model = tiny_gguf(corrupt="duplicate_tokens")
    with trio.fail_after(60), pytest.raises(RunnerStartError) as caught:
        async with ProcessEngineFactory().open(LoadSpec(model_path=str(model), name="dup")):
            pytest.fail("a model with duplicate tokens loaded")
    assert "SIGABRT" in str(caught.value)
    assert "GGML_ASSERT" in str(caught.value)


async def test_corrupt_model_error_names_the_reason(tiny_gguf: TinyGGUF) -> None:
    model = tiny_gguf(corrupt="truncated")
    with trio.fail_after(60), pytest.raises(RunnerStartError, match="not within the file bounds"):
        async with ProcessEngineFactory().open(LoadSpec(model_path=str(model), name="bad")):
            pytest.fail("a truncated model loaded")


async def test_sigkill_mid_stream_reaches_the_caller_fast(tiny_gguf: TinyGGUF) -> None:
    model = tiny_gguf(ctx=8192)
    spec = LoadSpec(model_path=str(model), name="tiny", num_ctx=8192, num_thread=1)
    request = CompletionRequest(prompt="hello", options={"num_predict": 8000, "ignore_eos": True})
    seen: dict[str, Any] = {}

    async def kill_mid_stream() -> None:
        async with ProcessEngineFactory().open(spec) as engine, engine.complete(request) as stream:
            async for _ in stream:
                if "killed_at" not in seen:
                    os.kill(engine.pid or 0, signal.SIGKILL)
                    seen["killed_at"] = trio.current_time()
            # Unreachable: the stream must fail, not end.
        seen["ended"] = True

    with trio.fail_after(60), pytest.raises(RunnerCrashedError, match="SIGKILL") as caught:
        await kill_mid_stream()
    assert trio.current_time() - seen["killed_at"] < 1.0
    assert "ended" not in seen
    assert caught.value.returncode == -signal.SIGKILL


async def test_crash_cancels_the_open_block(tiny_gguf: TinyGGUF) -> None:
    model = tiny_gguf()
    seen: dict[str, float] = {}

    async def kill_and_wait() -> None:
        async with ProcessEngineFactory().open(LoadSpec(model_path=str(model), name="t")) as engine:
            os.kill(engine.pid or 0, signal.SIGKILL)
            seen["killed_at"] = trio.current_time()
            await trio.sleep_forever()

    with trio.fail_after(60), pytest.raises(RunnerCrashedError, match="SIGKILL") as caught:
        await kill_and_wait()
    assert trio.current_time() - seen["killed_at"] < 1.0
    assert caught.value.returncode == -signal.SIGKILL


def fake_runner(tmp_path: Path, script: str) -> str:
    """An executable that stands in for the Python interpreter running the runner."""
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    ("script", "minimum"),
    [
        ("exec sleep 30\n", 0.0),
        ("for i in 1 2 3 4 5; do echo loading >&2; sleep 0.2; done\nexec sleep 30\n", 0.7),
    ],
    ids=["silent", "progress-extends"],
)
async def test_load_timeout_fires_only_without_progress(
    tmp_path: Path, script: str, minimum: float
) -> None:
    factory = ProcessEngineFactory(load_timeout=0.5, python=fake_runner(tmp_path, script))
    start = trio.current_time()
    with trio.fail_after(10), pytest.raises(RunnerStartError, match="timed out"):
        async with factory.open(LoadSpec(model_path="x.gguf", name="x")):
            pytest.fail("a fake runner became ready")
    elapsed = trio.current_time() - start
    assert minimum + 0.5 <= elapsed < minimum + 3.0


async def test_close_kills_a_runner_that_ignores_sigterm(tmp_path: Path) -> None:
    ready = '{"event":"ready","socket":"/nonexistent.sock","pid":0,"context_length":8,"memory":{}}'
    script = f"trap '' TERM\nread config\necho '{ready}'\nexec sleep 30\n"
    factory = ProcessEngineFactory(kill_grace=0.3, python=fake_runner(tmp_path, script))
    with trio.fail_after(10):
        async with factory.open(LoadSpec(model_path="x.gguf", name="x")) as engine:
            pid = engine.pid
        closed_at = trio.current_time()
    assert engine.returncode == -signal.SIGKILL
    assert closed_at  # reached only once the process was reaped
    assert not psutil.pid_exists(pid or 0)


# -- SmolLM2 (slow) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_runner(smollm2_path: Path) -> Iterator[RawRunner]:
    spec = LoadSpec(model_path=str(smollm2_path), name="smollm2", num_ctx=2048, embedding=True)
    runner = start_raw_runner(spec)
    assert runner.ready["event"] == "ready", runner.ready
    yield runner
    runner.stop()


@pytest.fixture
async def smollm2(smollm2_runner: RawRunner) -> AsyncIterator[RunnerClient]:
    async with open_runner_http(smollm2_runner.socket, smollm2_runner.config.api_key) as http:
        yield RunnerClient(name="smollm2", context_length=2048, http=http)


@pytest.mark.slow
async def test_smollm2_knows_the_capital_of_france(smollm2: RunnerClient) -> None:
    request = CompletionRequest(
        messages=[
            Message("system", "You are a helpful assistant."),
            Message("user", "What is the capital of France?"),
        ],
        options={"temperature": 0, "num_predict": 32},
    )
    with trio.fail_after(60):
        chunks = await collect(smollm2, request)
    assert "Paris" in "".join(c.content for c in chunks)
    assert chunks[-1].done_reason == "stop"


@pytest.mark.slow
async def test_smollm2_embeddings_are_normalised(smollm2: RunnerClient) -> None:
    with trio.fail_after(60):
        result = await smollm2.embed(["Paris is in France", "a cat"])
    assert {len(v) for v in result.vectors} == {576}
    for vector in result.vectors:
        assert math.fsum(x * x for x in vector) == pytest.approx(1.0)


async def test_a_generation_stuck_on_one_piece_is_ended() -> None:
    # As Ollama: 31 identical pieces in a row end the answer; the final chunk says "stop".
    async def body() -> AsyncIterator[bytes]:
        yield b'data: {"content": "Hello", "stop": false}\n\n'
        for _ in range(100):
            yield b'data: {"content": " la", "stop": false}\n\n'

    async with aclosing(body()) as source:
        events = ScriptedEvents(source)
        client = RunnerClient(name="t", context_length=2048)
        stream = ChunkStream(client, events, CompletionStream(), None, trio.CancelScope())
        chunks = [chunk async for chunk in stream]
    assert [c.content for c in chunks[:-1]] == ["Hello"] + [" la"] * 31
    assert chunks[-1].done
    assert chunks[-1].done_reason == "stop"
    assert chunks[-1].eval_count == 33


async def test_lora_adapter_is_applied(tiny_gguf: TinyGGUF, tmp_path: Path) -> None:
    from ollamatrio.testing import write_tiny_lora

    model = str(tiny_gguf())
    adapter = str(write_tiny_lora(tmp_path / "adapter.gguf"))
    factory = ProcessEngineFactory(kill_grace=2.0)

    async def greedy(adapters: tuple[str, ...]) -> str:
        spec = LoadSpec(model_path=model, name="tiny", num_ctx=256, adapters=adapters)
        async with factory.open(spec) as engine:
            request = CompletionRequest(
                prompt="hello world", options={"num_predict": 12, "temperature": 0}
            )
            async with engine.complete(request) as chunks:
                return "".join([chunk.content async for chunk in chunks])

    with trio.fail_after(60):
        base, again, adapted = await greedy(()), await greedy(()), await greedy((adapter,))
    assert base == again  # greedy decoding is deterministic...
    assert adapted != base  # ...so the difference is the adapter's


def _pipes() -> int:
    """Pipe descriptors this process holds (a runner's stdin, stdout and stderr are three)."""
    folder = f"/proc/{os.getpid()}/fd"
    names = []
    for fd in os.listdir(folder):
        try:
            names.append(os.readlink(f"{folder}/{fd}"))
        except OSError:
            continue
    return sum(name.startswith("pipe:") for name in names)


async def test_a_runners_pipes_are_closed_when_it_ends(tiny_gguf: TinyGGUF) -> None:
    """Unloaded, crashed or failed to load: none of its three pipes stays open (they used
    to stay until the garbage collector found the process object)."""
    import gc

    gc.disable()  # the collector must not be what closes them
    try:
        before = _pipes()
        model = tiny_gguf()
        spec = LoadSpec(model_path=str(model), name="t", num_thread=1)
        with trio.fail_after(120):
            for _ in range(2):
                async with ProcessEngineFactory().open(spec):
                    assert _pipes() >= before + 3
            assert _pipes() == before
            with pytest.raises(RunnerCrashedError):
                async with ProcessEngineFactory().open(spec) as engine:
                    os.kill(engine.pid or 0, signal.SIGKILL)
                    await trio.sleep_forever()
            assert _pipes() == before
            bad = tiny_gguf(corrupt="truncated")
            with pytest.raises(RunnerStartError):
                async with ProcessEngineFactory().open(LoadSpec(model_path=str(bad), name="b")):
                    pytest.fail("a truncated model loaded")
            assert _pipes() == before
    finally:
        gc.enable()
