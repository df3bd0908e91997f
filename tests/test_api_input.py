"""Hostile and out-of-range input on every route: it is refused with a 400 (OpenAI's error
shape on ``/v1``) before a runner sees it, or repaired as Go's JSON decoder repairs it; a
full queue is refused at once with ``Retry-After``; the importer and the embedder report
the exact reason for what they refuse."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import httpx
import pytest
import trio
from helpers.recording import RecordingEngines

from ollamatrio.api.bodies import MAX_JSON_DEPTH, decode_json_object, merge_options
from ollamatrio.devices import cpu_count
from ollamatrio.engines.llamacpp_wire import EMBED_INPUT_TOO_LONG, is_embedding_input_limit
from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.engines.simulated import SimulatedBehaviour
from ollamatrio.errors import InvalidRequestError

NATIVE_POSTS = [
    "/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/api/show", "/api/create",
    "/api/copy", "/api/pull", "/api/push",
]  # fmt: skip
OPENAI_POSTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]


def openai_error(r: httpx.Response) -> str:
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return str(error["message"])


# -- nesting ----------------------------------------------------------------------------


async def test_deeply_nested_json_is_a_400_everywhere(api_server) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    within_parser = b'{"model": "tiny", "format": ' + b"[" * 900 + b"]" * 900 + b"}"
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            for body in (deep, within_parser):
                for path in NATIVE_POSTS:
                    r = await c.post(path, content=body)
                    assert r.status_code == 400, (path, r.text)
                    assert r.json() == {
                        "error": f"invalid JSON: exceeded max depth ({MAX_JSON_DEPTH})"
                    }
                r = await c.request("DELETE", "/api/delete", content=body)
                assert r.status_code == 400
                for path in OPENAI_POSTS:
                    r = await c.post(path, content=body)
                    assert r.status_code == 400, (path, r.text)
                    assert openai_error(r) == f"invalid JSON: exceeded max depth ({MAX_JSON_DEPTH})"


async def test_nested_tool_call_arguments_on_v1_are_a_400(api_server) -> None:
    arguments = "[" * 100_000 + "]" * 100_000
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    body = {"model": "tiny", "messages": [{"role": "assistant", "tool_calls": [call]}]}
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 400, r.text
            assert openai_error(r) == "invalid tool call arguments"


def test_nesting_up_to_the_limit_is_accepted() -> None:
    def nested(depth: int) -> bytes:  # the body object is one level
        return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"

    assert decode_json_object(nested(MAX_JSON_DEPTH))["a"]
    with pytest.raises(InvalidRequestError, match="exceeded max depth"):
        decode_json_object(nested(MAX_JSON_DEPTH + 1))


# -- strings Go's decoder would repair, numbers it would refuse ------------------------


@pytest.mark.parametrize(
    ("raw", "decoded"),
    [
        (rb'{"s": "\ud800"}', {"s": "\ufffd"}),
        (rb'{"s": "a\udc00b\ud800"}', {"s": "a\ufffdb\ufffd"}),
        (rb'{"s": "\ud83d\ude00"}', {"s": "\U0001f600"}),  # a valid pair stays
        (rb'{"s": "\\ud800"}', {"s": "\\ud800"}),  # an escaped backslash, no escape
        (rb'{"\ud800": ["\udfff", {"k": "\ud800x"}]}', {"\ufffd": ["\ufffd", {"k": "\ufffdx"}]}),
        (b'{"s": "\xff\xfeok"}', {"s": "\ufffd\ufffdok"}),  # invalid UTF-8
        (b'{"s": "\xed\xa0\x80"}', {"s": "\ufffd\ufffd\ufffd"}),  # an encoded surrogate
        (b'\xef\xbb\xbf{"s": 1}', {"s": 1}),  # a UTF-8 byte order mark
    ],
)
def test_lone_surrogates_and_bad_utf8_become_replacement_characters(
    raw: bytes, decoded: dict[str, Any]
) -> None:
    assert decode_json_object(raw) == decoded


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"temperature": NaN}', "invalid JSON: NaN is not a JSON value"),
        (b'{"temperature": -Infinity}', "invalid JSON: -Infinity is not a JSON value"),
        (b'{"temperature": 1e400}', "invalid JSON: number 1e400 is out of range"),
    ],
)
def test_numbers_json_does_not_allow_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        decode_json_object(raw)
    assert str(caught.value) == message


async def test_lone_surrogates_reach_the_engine_as_replacement_characters(api_server) -> None:
    engines = RecordingEngines()
    bodies = [
        ("/api/generate", {"model": "tiny", "prompt": "\ud800", "system": "s\udfff"}),
        ("/api/chat", {"model": "tiny", "messages": [{"role": "user", "content": "\ud800"}]}),
        ("/v1/completions", {"model": "tiny", "prompt": "\ud800"}),
        ("/v1/chat/completions",
         {"model": "tiny", "messages": [{"role": "user", "content": "x\ud800"}]}),
    ]  # fmt: skip
    with trio.fail_after(20):
        async with (
            api_server(engines=engines) as srv,
            httpx.AsyncClient(base_url=srv.url) as c,
        ):
            for path, body in bodies:
                # json.dumps escapes the lone surrogate as \ud800, as a client would send it.
                r = await c.post(path, content=json.dumps({**body, "stream": False}))
                assert r.status_code == 200, (path, r.text)
                sent = engines.requests[-1]
                messages = [m.to_ollama() for m in sent.messages or ()]
                text = json.dumps([sent.prompt, messages], ensure_ascii=False)
                assert "\ufffd" in text
                text.encode()  # no surrogate left anywhere
            for path, body in [
                ("/api/embeddings", {"model": "tiny-embed", "prompt": "\ud800"}),
                ("/api/embed", {"model": "tiny-embed", "input": ["\ud800", "ok"]}),
                ("/v1/embeddings", {"model": "tiny-embed", "input": "\udc00"}),
            ]:
                r = await c.post(path, content=json.dumps(body))
                assert r.status_code == 200, (path, r.text)
            # A name echoed back in an error: the response is valid UTF-8 JSON.
            r = await c.post("/api/show", content=json.dumps({"model": "tiny\ud800"}))
            assert r.status_code in (400, 404)
            assert r.json()["error"]


# -- options ----------------------------------------------------------------------------

MAX_THREADS = cpu_count() * 4
INT32_MAX = 2**31 - 1


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"num_thread": 10**12}, f"option num_thread must be between 0 and {MAX_THREADS}"),
        ({"num_thread": MAX_THREADS + 1},
         f"option num_thread must be between 0 and {MAX_THREADS}"),
        ({"num_thread": -1}, f"option num_thread must be between 0 and {MAX_THREADS}"),
        ({"num_ctx": 2**24 + 1}, "option num_ctx must be between 0 and 16777216"),
        ({"num_ctx": -4}, "option num_ctx must be between 0 and 16777216"),
        ({"num_batch": -1}, "option num_batch must be between 0 and 16777216"),
        ({"num_gpu": -2}, f"option num_gpu must be between -1 and {INT32_MAX}"),
        ({"num_gpu": 2**31}, f"option num_gpu must be between -1 and {INT32_MAX}"),
        ({"main_gpu": -1}, f"option main_gpu must be between 0 and {INT32_MAX}"),
        ({"num_predict": -3}, f"option num_predict must be between -2 and {INT32_MAX}"),
        ({"num_predict": 10**12}, f"option num_predict must be between -2 and {INT32_MAX}"),
        ({"num_keep": -2}, f"option num_keep must be between -1 and {INT32_MAX}"),
        ({"top_k": -1}, f"option top_k must be between 0 and {INT32_MAX}"),
        ({"repeat_last_n": -2}, f"option repeat_last_n must be between -1 and {INT32_MAX}"),
        ({"draft_num_predict": -1},
         f"option draft_num_predict must be between 0 and {INT32_MAX}"),
        ({"seed": 2**63}, f"option seed must be between {-(2**63)} and {2**63 - 1}"),
        ({"temperature": -0.5}, "option temperature must be at least 0"),
        ({"repeat_penalty": -1}, "option repeat_penalty must be at least 0"),
        ({"top_p": 1.5}, "option top_p must be between 0 and 1"),
        ({"min_p": -0.1}, "option min_p must be between 0 and 1"),
        ({"typical_p": 2}, "option typical_p must be between 0 and 1"),
        ({"num_thread": "4"}, "option num_thread must be of type integer"),
        ({"num_ctx": 1.5}, "option num_ctx must be of type integer"),
        ({"top_p": "high"}, "option top_p must be of type float"),
        ({"use_mmap": 1}, "option use_mmap must be of type boolean"),
        ({"stop": [1]}, "option stop must be of type array of strings"),
    ],
)  # fmt: skip
async def test_out_of_range_options_are_a_400_before_any_load(
    api_server, options: dict[str, Any], error: str
) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            requests = [
                ("/api/generate", {"model": "tiny", "prompt": "x", "options": options}),
                ("/api/chat", {"model": "tiny", "messages": [], "options": options}),
                ("/api/embed", {"model": "tiny-embed", "input": "x", "options": options}),
                ("/api/embeddings", {"model": "tiny-embed", "prompt": "x", "options": options}),
                ("/api/create", {"model": "new", "from": "tiny", "parameters": options}),
            ]
            for path, body in requests:
                r = await c.post(path, json=body)
                assert (r.status_code, r.json()) == (400, {"error": error}), path
            assert srv.engines.loads == 0
            assert srv.scheduler.ps() == []


def test_options_at_the_edges_of_their_ranges_are_accepted() -> None:
    edges = {
        "num_thread": MAX_THREADS, "num_ctx": 2**24, "num_batch": 0, "num_gpu": -1,
        "main_gpu": 0, "num_predict": -2, "num_keep": -1, "top_k": 0, "repeat_last_n": -1,
        "seed": -1, "temperature": 0, "top_p": 1, "min_p": 0.0, "typical_p": 1.0,
        "repeat_penalty": 0, "presence_penalty": -2.5, "frequency_penalty": 2.5,
        "draft_num_predict": 0, "use_mmap": False, "stop": "one", "numa": "ignored",
    }  # fmt: skip
    merged = merge_options(edges)
    assert merged["stop"] == ["one"]
    assert merged["num_thread"] == MAX_THREADS
    assert "numa" not in merged
    assert merge_options({"num_gpu": 999})["num_gpu"] == 999  # "all layers", as clients say


async def test_a_huge_num_thread_no_longer_kills_the_runner(api_server) -> None:
    """The repro of the soak: a real runner died on ``num_thread: 10**12`` (500)."""
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=60) as c,
        ):
            body = {"model": "tiny-embed", "input": "x", "options": {"num_thread": 10**12}}
            r = await c.post("/api/embed", json=body)
            assert r.status_code == 400
            assert r.json()["error"].startswith("option num_thread must be between 0 and ")
            assert srv.scheduler.ps() == []


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("temperature", "hot", "temperature must be of type float"),
        ("temperature", -1, "temperature must be at least 0"),
        ("top_p", 1.5, "top_p must be between 0 and 1"),
        ("max_tokens", 10**12, f"max_tokens must be between -2 and {INT32_MAX}"),
        ("max_completion_tokens", "9", "max_completion_tokens must be of type integer"),
        ("seed", 1.5, "seed must be of type integer"),
        ("frequency_penalty", True, "frequency_penalty must be of type float"),
    ],
)
async def test_out_of_range_v1_fields_are_a_400_naming_the_field(
    api_server, field: str, value: Any, error: str
) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            messages = [{"role": "user", "content": "x"}]
            for path, body in [
                ("/v1/chat/completions", {"model": "tiny", "messages": messages}),
                ("/v1/completions", {"model": "tiny", "prompt": "x"}),
            ]:
                r = await c.post(path, json={**body, field: value})
                assert r.status_code == 400, (path, r.text)
                assert openai_error(r) == error
            assert srv.engines.loads == 0


async def test_integers_beyond_64_bits_are_a_400(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/api/embed", json={"model": "tiny-embed", "input": "x",
                                                 "dimensions": 10**30})  # fmt: skip
            assert r.status_code == 400
            assert r.json()["error"] == "invalid value for 'dimensions': integer out of range"
            # Within range, more dimensions than the model has leave its vectors whole.
            r = await c.post("/api/embed", json={"model": "tiny-embed", "input": "x",
                                                 "dimensions": 10**12})  # fmt: skip
            assert r.status_code == 200
            assert len(r.json()["embeddings"][0]) == 64


# -- a full queue -----------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/generate", "/v1/completions"])
async def test_a_full_queue_refuses_at_once_with_retry_after(api_server, path: str) -> None:
    """Over ``OLLAMA_MAX_QUEUE``, a request is refused before any slow work of its own
    (here a store that takes 3 s to resolve a name), and is told when to come back."""
    slow = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=20, default_num_predict=400)
    with trio.fail_after(60):
        async with (
            api_server(behaviour=slow, max_queue=2, num_parallel=1) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=30) as c,
            trio.open_nursery() as nursery,
        ):
            body = {"model": "tiny", "prompt": "hi", "stream": True}
            await c.post("/api/generate", json={"model": "tiny"})  # loaded: no load queue

            async def hold() -> None:
                async with c.stream("POST", "/api/generate", json=body) as r:
                    await r.aread()

            for _ in range(3):  # one generating, two waiting for its slot
                nursery.start_soon(hold)
            (info,) = srv.scheduler.ps()
            runner = srv.scheduler.runner(info.model_path)
            with trio.fail_after(10):
                await runner.wait_until(lambda: runner.slot_waiters == 2)
            assert srv.scheduler.waiting == 2

            resolve = srv.store.resolve

            def slow_resolve(name: Any) -> Any:
                time.sleep(3)
                return resolve(name)

            srv.store.resolve = slow_resolve  # type: ignore[method-assign]
            started = time.monotonic()
            # A spelling of the name the server has not resolved yet: it would go to the store.
            r = await c.post(path, json={**body, "model": "tiny:latest", "stream": False})
            elapsed = time.monotonic() - started
            assert r.status_code == 503
            assert r.headers["retry-after"] == "1"
            message = "server busy, please try again.  maximum pending requests exceeded"
            if path.startswith("/v1"):
                assert r.json()["error"]["message"] == message
            else:
                assert r.json() == {"error": message}
            assert elapsed < 1.0
            nursery.cancel_scope.cancel()


# -- what the importer and the embedder refuse -------------------------------------------


async def _create_from_bytes(c: httpx.AsyncClient, data: bytes) -> httpx.Response:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    assert (await c.post(f"/api/blobs/{digest}", content=data)).status_code in (200, 201)
    return await c.post(
        "/api/create", json={"model": "broken", "files": {"m.gguf": digest}, "stream": False}
    )


async def test_create_reports_why_a_file_is_not_a_usable_gguf(api_server, tiny_gguf) -> None:
    good = await trio.Path(tiny_gguf()).read_bytes()
    absurd = bytearray(good[:24])
    absurd[8:16] = (2**40).to_bytes(8, "little")  # tensor count
    cases = [
        (b"", "not a GGUF file (only 0 bytes long, expected magic b'GGUF')"),
        (b"PK\x03\x04 a zip file", "not a GGUF file (starts with b'PK\\x03\\x04'"),
        (good[: len(good) // 2], "truncated: tensor "),
        (bytes(absurd), "implausible header: 1099511627776 tensors"),
    ]
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            for data, reason in cases:
                r = await _create_from_bytes(c, data)
                assert r.status_code == 400, r.text
                message = r.json()["error"]
                assert message.startswith(f"supplied file was not in GGUF format: {reason}")
                assert str(srv.settings.models_dir) not in message  # no store paths
            assert not any(t["name"] == "broken:latest"
                           for t in (await c.get("/api/tags")).json()["models"])  # fmt: skip


@pytest.mark.parametrize(
    ("message", "limit"),
    [
        ("input (103 tokens) is too large to process. increase the physical batch size "
         "(current batch size: 30)", True),
        ("input length exceeds the context length", True),
        ("request (302 tokens) exceeds the available context size (256 tokens), try "
         "increasing it", True),
        ("backend failed", False),
    ],
)  # fmt: skip
def test_embedding_input_limit_errors_are_recognised(message: str, limit: bool) -> None:
    # Ollama's TestNormalizeEmbeddingError cases.
    assert is_embedding_input_limit(message) is limit


async def test_an_over_long_embed_input_without_truncation_is_a_400_simulated(
    api_server,
) -> None:
    words = " ".join(["word"] * 20)
    body = {"model": "tiny-embed", "input": words, "options": {"num_ctx": 8}}
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/api/embed", json={**body, "truncate": False})
            assert (r.status_code, r.json()) == (400, {"error": EMBED_INPUT_TOO_LONG})
            r = await c.post("/api/embed", json=body)
            assert r.status_code == 200


async def test_an_over_long_embed_input_without_truncation_is_a_400(api_server) -> None:
    text = " ".join(["hello world"] * 3000)
    with trio.fail_after(120):
        async with (
            api_server(engines=ProcessEngineFactory(load_timeout=60)) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=60) as c,
        ):
            for path, body in [
                ("/api/embed", {"model": "tiny-embed", "input": text, "truncate": False}),
                ("/api/embed", {"model": "tiny-embed", "input": ["ok", text],
                                "truncate": False, "options": {"num_ctx": 64}}),
            ]:  # fmt: skip
                r = await c.post(path, json=body)
                assert (r.status_code, r.json()) == (400, {"error": EMBED_INPUT_TOO_LONG})
            # Truncation (the default) still embeds it, and the runner is still there.
            r = await c.post("/api/embed", json={"model": "tiny-embed", "input": text})
            assert r.status_code == 200
            assert len(r.json()["embeddings"]) == 1
            assert srv.scheduler.ps()
