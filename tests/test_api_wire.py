"""Wire-level behaviour of the native API (docs/api.md, Conventions) with raw httpx on real
hypercorn: NDJSON framing, stream defaults, statuses, option and keep_alive rules,
load/unload, blobs, the Host and CORS guards, and client disconnects."""

from __future__ import annotations

import hashlib
import json
import math
import time
from datetime import datetime
from typing import Any

import httpx
import pytest
import trio
from helpers.recording import RecordingEngines

from ollamatrio._version import OLLAMA_API_VERSION, __version__
from ollamatrio.api.bodies import MAX_JSON_BODY
from ollamatrio.config import parse_origins
from ollamatrio.engines.simulated import SimulatedBehaviour
from ollamatrio.gguf import ArraySummary, read_gguf


def lines_of(response: httpx.Response) -> list[dict[str, Any]]:
    """Every line must be one JSON object: no blank lines, no SSE framing.  The lines of a
    load the stream waited for (tests/test_api_load_progress.py) are left out."""
    raw = response.text.split("\n")
    assert raw[-1] == ""  # each line ends in a newline
    assert all(line.strip() for line in raw[:-1]), "blank line in an NDJSON stream"
    return [obj for line in raw[:-1] if "load_progress" not in (obj := json.loads(line))]


# -- framing and defaults ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "key"),
    [
        ("/api/generate", {"model": "tiny", "prompt": "hi"}, "response"),
        (
            "/api/chat",
            {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            "message",
        ),
    ],
    ids=["generate", "chat"],
)
async def test_streams_by_default_as_ndjson(api_server, path: str, body: dict, key: str) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post(path, json=body)
            assert r.status_code == 200
            assert r.headers["content-type"] == "application/x-ndjson"
            lines = lines_of(r)
            assert len(lines) == 17
            for line in lines:
                assert line["model"] == "tiny"
                assert key in line
                datetime.fromisoformat(line["created_at"])
                assert line["created_at"].endswith("Z")
            assert [line["done"] for line in lines] == [False] * 16 + [True]
            final = lines[-1]
            assert final["done_reason"] == "stop"
            for field in ("total_duration", "load_duration", "prompt_eval_count",
                          "prompt_eval_duration", "eval_count", "eval_duration"):  # fmt: skip
                assert isinstance(final[field], int)
            assert final["eval_duration"] == 8_000_000  # 16 tokens at 2000/s, in ns


@pytest.mark.parametrize("stream", [False, None], ids=["false", "null-means-true"])
async def test_stream_false_is_one_object(api_server, stream: bool | None) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post(
                "/api/chat",
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                      "stream": stream},
            )  # fmt: skip
            if stream is None:
                assert r.headers["content-type"] == "application/x-ndjson"
                return
            assert r.headers["content-type"] == "application/json; charset=utf-8"
            obj = r.json()
            assert obj["done"] is True
            assert obj["message"]["role"] == "assistant"
            assert len(obj["message"]["content"].split()) == 16


async def test_model_is_echoed_as_sent(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            name = "registry.ollama.ai/library/TINY:latest"
            r = await c.post("/api/generate", json={"model": name, "prompt": "x", "stream": False})
            assert r.json()["model"] == name
            ps = (await c.get("/api/ps")).json()["models"]
            assert [m["name"] for m in ps] == ["tiny:latest"]


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "content", "status", "error"),
    [
        ("/api/generate", b"{not json", 400, None),
        ("/api/generate", b"", 400, "missing request body"),
        ("/api/generate", b"[1, 2]", 400, "request body must be a JSON object"),
        ("/api/generate", b'{"prompt": "x"}', 400, "model is required"),
        ("/api/generate", b'{"model": "../../etc/passwd"}', 400, "invalid model name"),
        ("/api/chat", b'{"model": "a/b/c/d/e"}', 400, "invalid model name"),
        (
            "/api/generate",
            b'{"model": "nope", "prompt": "x"}',
            404,
            "model 'nope' not found",
        ),
        ("/api/show", b'{"model": "nope"}', 404, "model 'nope' not found"),
        ("/api/delete", b'{"model": "nope"}', 404, "model 'nope' not found"),
        (
            "/api/generate",
            b'{"model": "tiny", "prompt": "x", "options": {"num_predict": "3"}}',
            400,
            "option num_predict must be of type integer",
        ),
        (
            "/api/generate",
            b'{"model": "tiny", "prompt": "x", "options": {"temperature": true}}',
            400,
            "option temperature must be of type float",
        ),
        (
            "/api/generate",
            b'{"model": "tiny", "prompt": "x", "keep_alive": "300"}',
            400,
            'time: missing unit in duration "300"',
        ),
        (
            "/api/generate",
            b'{"model": "tiny", "prompt": "x", "format": "yaml"}',
            400,
            'invalid format: expected "json" or a valid JSON schema',
        ),
        (
            "/api/generate",
            b'{"model": "tiny", "prompt": "x", "raw": true, "system": "s"}',
            400,
            "raw mode does not support template, system, or context",
        ),
        (
            "/api/generate",
            b'{"model": "tiny", "prompt": "x", "images": ["aGk="]}',
            400,
            '"tiny" does not support vision',
        ),
        (
            "/api/generate",
            b'{"model": "tiny", "prompt": "x", "think": true}',
            400,
            '"tiny" does not support thinking',
        ),
        (
            "/api/generate",
            b'{"model": "tiny", "prompt": "x", "top_logprobs": 21}',
            400,
            "top_logprobs must be between 0 and 20",
        ),
        (
            "/api/generate",
            b'{"model": "tiny-embed", "prompt": "x"}',
            400,
            '"tiny-embed" does not support generate',
        ),
        ("/api/embed", b'{"model": "tiny-embed", "input": 3}', 400, "invalid input type"),
        ("/api/create", b'{"model": "new"}', 400, "neither 'from' or 'files' was specified"),
        ("/api/create", b'{"model": "new", "from": "tiny", "quantize": "q6_K"}', 400, None),
        ("/api/copy", b'{"source": "tiny"}', 400, 'destination "" is invalid'),
        ("/api/copy", b'{"destination": "x"}', 400, 'source "" is invalid'),
        ("/api/create", b'{"from": "tiny"}', 400, "invalid model name"),
        (
            "/api/generate",
            b'{"model": "tiny", "prompt": "x", "suffix": "y"}',
            400,
            "registry.ollama.ai/library/tiny:latest does not support insert",
        ),
    ],
    ids=lambda v: v if isinstance(v, int) else None,
)
async def test_error_statuses(api_server, path: str, content: bytes, status: int, error) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = (
                await c.post(path, content=content)
                if path != "/api/delete"
                else (await c.request("DELETE", path, content=content))
            )
            assert r.status_code == status, r.text
            assert r.headers["content-type"] == "application/json; charset=utf-8"
            message = r.json()["error"]
            if error is not None:
                assert message == error
            else:
                assert message


async def test_oversized_json_body_is_413(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            padding = b" " * (MAX_JSON_BODY + 1)
            r = await c.post("/api/generate", content=b'{"model": "tiny"}' + padding)
            assert r.status_code == 413


async def test_error_before_first_byte_keeps_its_status(api_server) -> None:
    with trio.fail_after(20):
        behaviour = SimulatedBehaviour(load_seconds=0.01, fail_load="error")
        async with api_server(behaviour=behaviour) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            # A stream that waits for a load has started (progress lines): see
            # test_api_load_progress.py.  /v1 streams send no progress, so keep the status.
            r = await c.post(
                "/v1/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                      "stream": True},
            )  # fmt: skip
            assert r.status_code == 500
            assert "error loading model" in r.json()["error"]["message"]


async def test_error_mid_stream_is_one_final_line(api_server) -> None:
    with trio.fail_after(20):
        behaviour = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=2000,
                                       crash_after_tokens=3)  # fmt: skip
        async with api_server(behaviour=behaviour) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/api/generate", json={"model": "tiny", "prompt": "x"})
            assert r.status_code == 200
            lines = lines_of(r)
            assert [set(line) >= {"response"} for line in lines[:3]] == [True] * 3
            assert list(lines[3]) == ["error"]
            assert "stopped" in lines[3]["error"]
            assert len(lines) == 4
            # Not streaming: the error gets a status instead.
            r = await c.post("/api/generate", json={"model": "tiny", "prompt": "x",
                                                     "stream": False})  # fmt: skip
            assert r.status_code == 500


# -- options and keep_alive ---------------------------------------------------------------


async def test_options_merge_model_params_then_request(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/api/create", json={"model": "capped", "from": "tiny",
                                                  "parameters": {"num_predict": 4},
                                                  "stream": False})  # fmt: skip
            assert r.json() == {"status": "success"}
            r = await c.post("/api/generate", json={"model": "capped", "prompt": "x",
                                                    "stream": False})  # fmt: skip
            assert (r.json()["eval_count"], r.json()["done_reason"]) == (4, "length")
            r = await c.post(
                "/api/generate",
                json={"model": "capped", "prompt": "x", "stream": False,
                      "options": {"num_predict": 2, "no_such_option": [1], "mirostat": 2}},
            )  # fmt: skip
            assert r.status_code == 200
            assert r.json()["eval_count"] == 2


@pytest.mark.parametrize(
    ("keep_alive", "expected"),
    [(1.5, 1.5), (600, 600.0), ("10m", 600.0), ("-1m", math.inf), (-1, math.inf)],
    ids=["float", "int", "duration", "negative-duration", "negative"],
)
async def test_keep_alive_values(api_server, keep_alive: Any, expected: float) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/api/generate", json={"model": "tiny", "prompt": "x",
                                                    "keep_alive": keep_alive})  # fmt: skip
            assert r.status_code == 200
            (info,) = srv.scheduler.ps()
            assert info.keep_alive == expected
            (shown,) = (await c.get("/api/ps")).json()["models"]
            expires = datetime.fromisoformat(shown["expires_at"]).timestamp()
            if math.isinf(expected):
                assert expires > time.time() + 100 * 365 * 86400
            else:
                assert abs(expires - (time.time() + expected)) < 2


# -- load and unload requests -------------------------------------------------------------


async def test_load_then_unload(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/api/generate", json={"model": "tiny"})
            assert r.headers["content-type"] == "application/json; charset=utf-8"
            obj = r.json()
            assert (obj["done"], obj["done_reason"], obj["response"]) == (True, "load", "")
            assert [i.name for i in srv.scheduler.ps()] == ["tiny:latest"]

            r = await c.post("/api/generate", json={"model": "tiny", "keep_alive": 0})
            assert r.json()["done_reason"] == "unload"
            await srv.scheduler.wait_idle()
            assert srv.scheduler.ps() == []
            # A model that exists but is not loaded still answers "unload".
            r = await c.post("/api/chat", json={"model": "tiny", "messages": [], "keep_alive": 0})
            assert r.status_code == 200
            assert r.json()["done_reason"] == "unload"
            assert r.json()["message"] == {"role": "assistant", "content": ""}
            assert srv.engines.loads == 1


async def test_an_unload_ends_the_runner_another_name_of_the_same_file_loaded(
    api_server,
) -> None:
    """As Ollama 0.24 (measured, docs/compat.md "Unloading by name"): runners are per model
    file, so unloading ``tiny`` ends the runner ``tiny2`` (``tiny`` with another num_ctx)
    loaded, and the answer comes once it has stopped."""
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            create = {"model": "tiny2", "from": "tiny", "parameters": {"num_ctx": 512}}
            assert (await c.post("/api/create", json={**create, "stream": False})).is_success
            await c.post("/api/generate", json={"model": "tiny2"})
            assert [i.name for i in srv.scheduler.ps()] == ["tiny2:latest"]
            r = await c.post("/api/generate", json={"model": "tiny", "keep_alive": 0})
            assert (r.json()["model"], r.json()["done_reason"]) == ("tiny", "unload")
            assert srv.scheduler.ps() == []
            assert (await c.get("/api/ps")).json()["models"] == []


async def test_embed_empty_input_loads_and_returns_nothing(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/api/embed", json={"model": "tiny-embed", "input": []})
            assert r.json() == {"model": "tiny-embed", "embeddings": []}  # as Ollama's
            r = await c.post("/api/embed", json={"model": "nope", "input": "x"})
            # Ollama leaves this lookup to its scheduler, whose words these are.
            assert r.json() == {"error": 'model "nope" not found, try pulling it first'}
            assert [i.name for i in srv.scheduler.ps()] == ["tiny-embed:latest"]
            r = await c.post("/api/embeddings", json={"model": "tiny-embed", "prompt": ""})
            assert r.json() == {"embedding": []}


# -- the store endpoints ------------------------------------------------------------------


async def test_blob_upload_statuses(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            data = b"\0" * (3 << 20) + b"tail"  # several batches, a sparse stretch
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            assert (await c.head(f"/api/blobs/{digest}")).status_code == 404
            r = await c.post(f"/api/blobs/{digest}", content=data)
            assert r.status_code == 201
            assert srv.store.blob_path(digest).read_bytes() == data
            assert (await c.post(f"/api/blobs/{digest}", content=data)).status_code == 200
            assert (await c.head(f"/api/blobs/{digest}")).status_code == 200

            other = "sha256:" + "0" * 64
            r = await c.post(f"/api/blobs/{other}", content=b"something else")
            assert r.status_code == 400
            assert "digest mismatch" in r.json()["error"]
            assert not srv.store.has_blob(other)
            assert (await c.head("/api/blobs/sha256:xyz")).status_code == 400
            assert (await c.post("/api/blobs/sha256:xyz", content=b"x")).status_code == 400


async def test_copy_delete_tags_are_plain_200(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/api/copy", json={"source": "tiny", "destination": "alias"})
            assert (r.status_code, r.content) == (200, b"")
            tags = (await c.get("/api/tags")).json()["models"]
            assert {t["name"] for t in tags} == {"tiny:latest", "tiny-embed:latest", "alias:latest"}
            for tag in tags:
                datetime.fromisoformat(tag["modified_at"])
                assert len(tag["digest"]) == 64
            r = await c.request("DELETE", "/api/delete", json={"model": "alias"})
            assert (r.status_code, r.content) == (200, b"")
            assert (await c.head("/api/tags")).status_code == 200


async def test_create_streams_progress(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.post("/api/create", json={"model": "mine", "from": "tiny",
                                                  "system": "hello"})  # fmt: skip
            assert r.headers["content-type"] == "application/x-ndjson"
            statuses = [line["status"] for line in lines_of(r)]
            assert statuses[-2:] == ["writing manifest", "success"]
            assert any(s.startswith("using existing layer sha256:") for s in statuses)
            show = (await c.post("/api/show", json={"model": "mine"})).json()
            assert show["system"] == "hello"
            # As Ollama: arrays are null unless verbose, tensors always listed.
            assert show["model_info"]["tokenizer.ggml.tokens"] is None
            assert len(show["tensors"]) > 0
            verbose = (await c.post("/api/show", json={"model": "mine", "verbose": True})).json()
            assert verbose["tensors"] == show["tensors"]


async def test_show_is_shaped_as_ollamas(api_server, tiny_gguf) -> None:
    """Empty texts left out, the vocabulary in full under verbose, whole floats as integers,
    the chat template in use (the GGUF's) as ``template`` and in the Modelfile."""
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            show = (await c.post("/api/show", json={"model": "tiny"})).json()
            assert not {"license", "system", "parameters"} & set(show)
            assert "general.name" not in show["model_info"]
            assert "tokenizer.chat_template" not in show["model_info"]
            info = read_gguf(tiny_gguf())
            assert show["template"] == info.chat_template
            assert "TEMPLATE" in show["modelfile"]
            verbose = (await c.post("/api/show", json={"model": "tiny", "verbose": True})).json()
            tokens = verbose["model_info"]["tokenizer.ggml.tokens"]
            assert isinstance(info.metadata["tokenizer.ggml.tokens"], ArraySummary)
            assert len(tokens) == len(info.metadata["tokenizer.ggml.tokens"]) > 64
            assert all(isinstance(t, str) for t in tokens)
            floats = [v for v in verbose["model_info"].values() if isinstance(v, float)]
            assert not [v for v in floats if v.is_integer()]
            whole = [k for k, v in info.metadata.items() if isinstance(v, float) and v.is_integer()]
            assert whole, "the tiny model has a whole float to check"
            assert all(type(verbose["model_info"][k]) is int for k in whole)


async def test_wrong_method_and_unknown_path_as_gin(api_server) -> None:
    """405 with Allow (methods in Gin's order) and plain text, streamed routes included;
    404 in plain text."""
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            for method, path, allow in [
                ("GET", "/api/chat", "POST"),
                ("GET", "/api/generate", "POST"),
                ("GET", "/v1/chat/completions", "POST"),
                ("GET", "/api/create", "POST"),
                ("POST", "/api/tags", "HEAD, GET"),
                ("POST", "/api/delete", "DELETE"),
                ("GET", "/api/blobs/sha256:" + "0" * 64, "HEAD, POST"),
            ]:
                r = await c.request(method, path)
                assert (r.status_code, r.text) == (405, "405 method not allowed"), path
                assert r.headers["allow"] == allow, path
                assert r.headers["content-type"] == "text/plain"
            r = await c.get("/api/nothing")
            assert (r.status_code, r.text) == (404, "404 page not found")
            assert r.headers["content-type"] == "text/plain"
            r = await c.options(
                "/api/chat",
                headers={"Origin": "http://localhost", "Access-Control-Request-Method": "POST"},
            )
            assert r.status_code == 204
            assert r.headers["allow"] == "POST"
            assert "content-type" not in r.headers


async def test_root_and_version(api_server) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.get("/")
            assert (r.status_code, r.text) == (200, "Ollama is running")
            assert (await c.head("/")).status_code == 200
            assert (await c.head("/api/version")).status_code == 200
            # The Ollama API version clients gate on (Codex needs >= 0.13.4), ours beside it.
            assert (await c.get("/api/version")).json() == {
                "version": OLLAMA_API_VERSION,
                "ollamatrio": __version__,
            }


# -- Host and CORS guards -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("localhost:11434", 200),
        ("127.0.0.1", 200),
        ("[::1]:80", 200),
        ("10.1.2.3", 200),
        ("myapp.localhost", 200),
        ("box.internal:8080", 200),
        ("evil.example.com", 403),
        ("8.8.8.8", 403),
    ],
)
async def test_host_header_guard_on_loopback(api_server, host: str, status: int) -> None:
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.get("/api/version", headers={"Host": host})
            assert r.status_code == status


async def test_host_header_not_checked_on_all_interfaces(api_server) -> None:
    with trio.fail_after(20):
        async with api_server(host="0.0.0.0") as srv:
            url = srv.url.replace("0.0.0.0", "127.0.0.1")
            async with httpx.AsyncClient(base_url=url) as c:
                r = await c.get("/api/version", headers={"Host": "evil.example.com"})
                assert r.status_code == 200


async def test_cors(api_server) -> None:
    with trio.fail_after(20):
        async with (
            api_server(origins=parse_origins("https://app.example.com")) as srv,
            httpx.AsyncClient(base_url=srv.url) as c,
        ):
            ok = {"Origin": "https://app.example.com"}
            r = await c.get("/api/version", headers=ok)
            assert r.headers["access-control-allow-origin"] == "https://app.example.com"
            r = await c.get("/api/version", headers={"Origin": "http://localhost:3000"})
            assert r.status_code == 200  # a built-in origin with a port wildcard
            r = await c.get("/api/version", headers={"Origin": "https://evil.example.com"})
            assert r.status_code == 403
            r = await c.options(
                "/v1/chat/completions",
                headers={**ok, "Access-Control-Request-Method": "POST",
                         "Access-Control-Request-Headers": "x-stainless-lang"},
            )  # fmt: skip
            assert r.status_code == 204
            assert "x-stainless-lang" in r.headers["access-control-allow-headers"].lower()
            assert "POST" in r.headers["access-control-allow-methods"]


def cors_headers_of(response: httpx.Response) -> list[tuple[str, str]]:
    return [(k, v) for k, v in response.headers.multi_items()
            if k.startswith("access-control-") or k == "vary"]  # fmt: skip


async def test_cors_refuses_a_disallowed_origin_without_allow_headers(api_server) -> None:
    """gin-contrib/cors aborts with a bare 403: a page from another origin learns nothing,
    and a preflight from it gets no Access-Control-Allow-* header to act on."""
    evil = {"Origin": "https://evil.example.com"}
    preflight = {**evil, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type"}  # fmt: skip
    with trio.fail_after(20):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            for r in (
                await c.options("/api/chat", headers=preflight),
                await c.options("/v1/chat/completions", headers=preflight),
                await c.get("/api/tags", headers=evil),
                await c.post("/api/chat", headers=evil, json={"model": "tiny"}),
            ):
                assert r.status_code == 403
                assert cors_headers_of(r) == []
                assert r.content == b""


async def test_cors_headers_are_ollamas(api_server) -> None:
    """An allowed origin gets exactly the headers Ollama sends; the server's own origin
    (fetch() sends one) is not a CORS request; OLLAMA_ORIGINS=* answers with ``*``."""
    ok = {"Origin": "https://app.example.com"}
    preflight = {**ok, "Access-Control-Request-Method": "POST"}
    with trio.fail_after(20):
        async with (
            api_server(origins=parse_origins("https://app.example.com")) as srv,
            httpx.AsyncClient(base_url=srv.url) as c,
        ):
            r = await c.options("/api/chat", headers=preflight)
            assert r.status_code == 204
            assert cors_headers_of(r) == [
                ("access-control-allow-methods", "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"),
                ("access-control-allow-headers",
                 "Authorization,Content-Type,User-Agent,Accept,X-Requested-With,Openai-Beta,"
                 "X-Stainless-Arch,X-Stainless-Async,X-Stainless-Custom-Poll-Interval,"
                 "X-Stainless-Helper-Method,X-Stainless-Lang,X-Stainless-Os,"
                 "X-Stainless-Package-Version,X-Stainless-Poll-Helper,X-Stainless-Retry-Count,"
                 "X-Stainless-Runtime,X-Stainless-Runtime-Version,X-Stainless-Timeout"),
                ("access-control-max-age", "43200"),
                ("vary", "Origin"),
                ("vary", "Access-Control-Request-Method"),
                ("vary", "Access-Control-Request-Headers"),
                ("access-control-allow-origin", "https://app.example.com"),
            ]  # fmt: skip
            r = await c.get("/api/version", headers=ok)
            assert r.status_code == 200
            assert cors_headers_of(r) == [
                ("vary", "Origin"),
                ("access-control-allow-origin", "https://app.example.com"),
            ]
            own = srv.url.replace("http://", "")
            r = await c.get("/api/version", headers={"Origin": f"http://{own}"})
            assert r.status_code == 200
            assert cors_headers_of(r) == []
        async with (
            api_server(origins=parse_origins("*")) as srv,
            httpx.AsyncClient(base_url=srv.url) as c,
        ):
            r = await c.get("/api/version", headers={"Origin": "https://anywhere.example"})
            assert cors_headers_of(r) == [("access-control-allow-origin", "*")]
            r = await c.options("/api/chat", headers=preflight)
            assert r.status_code == 204
            assert ("access-control-allow-origin", "*") in cors_headers_of(r)
            assert r.headers.get("vary") is None


# -- disconnects --------------------------------------------------------------------------


async def test_client_disconnect_frees_the_lease(api_server) -> None:
    behaviour = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=50,
                                   default_num_predict=10_000)  # fmt: skip
    with trio.fail_after(20):
        async with api_server(behaviour=behaviour) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            async with c.stream(
                "POST", "/api/generate", json={"model": "tiny", "prompt": "x"}
            ) as r:
                async for line in r.aiter_lines():
                    assert json.loads(line)["done"] is False
                    if "load_progress" not in line:  # the load's lines come first
                        break
                (info,) = srv.scheduler.ps()
                assert info.refs == 1
                engine = srv.engines.engines["tiny:latest"]
                assert engine.active_streams == 1
                # The server runs in this Trio run: wait on the runner's own state changes.
                runner = srv.scheduler.runner(info.model_path)
            # The response is closed mid-stream: httpx drops the connection.
            with trio.fail_after(0.1):
                await runner.wait_until(lambda: runner.refs == 0)
            assert engine.active_streams == 0
            assert engine.completed_streams == 0
            # The runner stays loaded and serves the next request.
            r2 = await c.post("/api/generate", json={"model": "tiny", "prompt": "x",
                                                     "options": {"num_predict": 2},
                                                     "stream": False})  # fmt: skip
            assert r2.json()["eval_count"] == 2


# -- what reaches the engine --------------------------------------------------------------


TOOLS_AND_THINKING = (
    "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% endif %}{% if enable_thinking %}<think>{% endif %}"
)


async def test_requests_reach_the_engine_as_ollama_builds_them(api_server, tiny_gguf) -> None:
    engines = RecordingEngines()
    extra = {"tool": tiny_gguf(chat_template=TOOLS_AND_THINKING, name="tooly")}
    with trio.fail_after(20):
        async with (
            api_server(engines=engines, models=extra) as srv,
            httpx.AsyncClient(base_url=srv.url) as c,
        ):
            r = await c.post("/api/create", json={
                "model": "persona", "from": "tool", "system": "You are terse.",
                "messages": [{"role": "user", "content": "earlier"},
                             {"role": "assistant", "content": "reply"}],
                "parameters": {"temperature": 0.1}, "stream": False,
            })  # fmt: skip
            assert r.status_code == 200, r.text
            caps = (await c.post("/api/show", json={"model": "persona"})).json()["capabilities"]
            assert caps == ["completion", "tools", "thinking"]

            schema = {"type": "object", "properties": {"a": {"type": "string"}}}
            tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
            await c.post("/api/chat", json={
                "model": "persona", "messages": [{"role": "user", "content": "now"}],
                "format": schema, "tools": [tool], "think": "high",
                "options": {"temperature": 0.5, "top_k": 3}, "stream": False,
            })  # fmt: skip
            chat = engines.requests[-1]
            assert chat.prompt is None
            assert [m.role for m in chat.messages] == ["system", "user", "assistant", "user"]
            assert chat.messages[0].content == "You are terse."
            assert (chat.format, list(chat.tools), chat.think) == (schema, [tool], "high")
            assert chat.options == {"temperature": 0.5, "top_k": 3}

            await c.post("/api/generate", json={"model": "persona", "prompt": "p",
                                                "system": "override", "stream": False})  # fmt: skip
            gen = engines.requests[-1]
            assert [m.role for m in gen.messages] == ["system", "user", "assistant", "user"]
            assert gen.messages[0].content == "override"
            assert gen.options == {"temperature": 0.1}

            await c.post("/api/generate", json={"model": "persona", "prompt": "<raw>",
                                                "raw": True, "format": "json",
                                                "stream": False})  # fmt: skip
            raw = engines.requests[-1]
            assert (raw.prompt, raw.messages, raw.format) == ("<raw>", None, "json")

            r = await c.post(
                "/api/chat",
                json={
                    "model": "tiny",
                    "tools": [tool],
                    "messages": [{"role": "user", "content": "x"}],
                },
            )
            assert r.status_code == 400
            assert (
                r.json()["error"] == "registry.ollama.ai/library/tiny:latest does not support tools"
            )


@pytest.mark.parametrize("path", ["/api/generate", "/v1/completions"])
async def test_client_gone_before_the_first_byte_returns_the_lease_at_once(
    api_server: Any, path: str
) -> None:
    # The route holds the generation (the lease is held) and is sending the head when the
    # client goes: the body was never started, yet the lease must come back now.
    slow = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=5)
    body = json.dumps({"model": "tiny", "prompt": "hi", "stream": True}).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 11434), "extensions": {},
    }  # fmt: skip
    received = False
    head_sent = trio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            head_sent.set()
            await trio.sleep_forever()  # the connection is gone: this write never completes

    async with api_server(behaviour=slow) as srv:
        with trio.fail_after(10):
            # Loaded first: a stream that waits for a load sends its head before the lease.
            async with httpx.AsyncClient(base_url=srv.url) as c:
                await c.post("/api/generate", json={"model": "tiny"})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(srv.app, scope, receive, send)
                await head_sent.wait()
                (info,) = srv.scheduler.ps()
                assert info.refs == 1
                nursery.cancel_scope.cancel()
            (info,) = srv.scheduler.ps()
            assert info.refs == 0
