"""Quotas and usage through a running server (simulated engine, port 0): each limit's 429
and ``Retry-After`` in each dialect's shape, the window admitting again, concurrency given
back when a client leaves mid-stream, a running stream never cut, ``GET /api/usage`` across
a restart, and the per-key series of ``/metrics``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from ollamatrio.auth.keys import ApiKey, KeyStore, Limits
from ollamatrio.engines.simulated import SimulatedBehaviour

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}
GENERATE = {"model": "tiny", "prompt": "hello there", "stream": False}


def key(name: str, **limits: int) -> ApiKey:
    return ApiKey(name, "", frozenset({"inference", "admin"}), Limits(**limits))


# The secret of each key the last ``serving`` made, by name (tests run one at a time).
SECRETS: dict[str, str] = {}


def as_key(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {SECRETS[name]}"}


@asynccontextmanager
async def serving(
    api_server: Any, folder: Path, *keys: ApiKey, **options: Any
) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """A server asking for keys, with ``keys`` in the key table of its state folder in
    ``folder`` (made once: a second server there finds them, as after a restart)."""
    state = folder / "state"
    table = KeyStore.in_folder(state)
    known = {k.name for k in table.list()}
    for wanted in keys:
        if wanted.name not in known:
            _, SECRETS[wanted.name] = table.create(wanted.name, wanted.scopes, wanted.limits)
    async with (
        api_server(auth="required", data_dir=state, **options) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=30) as client,
    ):
        yield srv, client


def usage_of(document: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [k for k in document["keys"] if k["name"] == name]
    return found


# -- refusals -----------------------------------------------------------------------------


async def test_over_requests_per_minute_each_dialect_its_shape(
    api_server: Any, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with serving(api_server, tmp_path, key("alice", rpm=1), key("carol")) as (
            _, client,
        ):  # fmt: skip
            assert (await client.get("/api/tags", headers=as_key("alice"))).status_code == 200
            refusals = {}
            for path, body in (
                ("/api/chat", CHAT),
                ("/v1/chat/completions", CHAT),
                ("/v1/messages", {**CHAT, "max_tokens": 8}),
                ("/v1/embeddings", {"model": "tiny-embed", "input": "x"}),
            ):
                r = await client.post(path, json=body, headers=as_key("alice"))
                assert r.status_code == 429, (path, r.text)
                assert 58 <= int(r.headers["retry-after"]) <= 60
                refusals[path] = r.json()
            message = refusals["/api/chat"]["error"]
            assert message.startswith("rate limit reached: 1 requests per minute")
            assert refusals["/v1/chat/completions"]["error"] == {
                "message": message, "type": "requests", "param": None,
                "code": "rate_limit_exceeded",
            }  # fmt: skip
            assert refusals["/v1/embeddings"]["error"]["code"] == "rate_limit_exceeded"
            anthropic = refusals["/v1/messages"]
            assert anthropic["type"] == "error"
            assert anthropic["error"] == {"type": "rate_limit_error", "message": message}
            # Another key, without limits, is not limited.
            for _ in range(3):
                r = await client.post("/api/chat", json=CHAT, headers=as_key("carol"))
                assert r.status_code == 200


async def test_over_tokens_per_minute_counted_after_the_fact(
    api_server: Any, tmp_path: Path
) -> None:
    with trio.fail_after(60):
        async with serving(api_server, tmp_path, key("alice", tpm=10)) as (_, client):
            body = {**GENERATE, "options": {"num_predict": 12}}
            r = await client.post("/api/generate", json=body, headers=as_key("alice"))
            assert r.status_code == 200  # admitted: nothing used yet
            assert r.json()["eval_count"] == 12
            r = await client.post("/v1/chat/completions", json=CHAT, headers=as_key("alice"))
            assert r.status_code == 429
            assert r.json()["error"]["type"] == "tokens"
            assert "10 tokens per minute" in r.json()["error"]["message"]
            assert 58 <= int(r.headers["retry-after"]) <= 60


async def test_the_window_admits_again_after_retry_after(
    autojump_clock: trio.abc.Clock, api_server: Any, tmp_path: Path
) -> None:
    # The clock jumps only after 30 ms of real idleness (as tests/test_api_serve.py).
    autojump_clock.autojump_threshold = 0.1  # type: ignore[attr-defined]
    with trio.fail_after(600):
        async with serving(api_server, tmp_path, key("alice", rpm=2)) as (_, client):
            for _ in range(2):
                r = await client.post("/api/chat", json=CHAT, headers=as_key("alice"))
                assert r.status_code == 200
                await trio.sleep(20)
            r = await client.post("/api/chat", json=CHAT, headers=as_key("alice"))
            assert r.status_code == 429
            wait = int(r.headers["retry-after"])
            assert 19 <= wait <= 20  # the first request leaves the window at 60 s
            await trio.sleep(wait - 1)
            r = await client.post("/api/chat", json=CHAT, headers=as_key("alice"))
            assert r.status_code == 429  # not yet
            await trio.sleep(int(r.headers["retry-after"]))
            r = await client.post("/api/chat", json=CHAT, headers=as_key("alice"))
            assert r.status_code == 200


async def test_concurrency_is_given_back_when_the_client_leaves(
    api_server: Any, tmp_path: Path
) -> None:
    slow = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=20)
    with trio.fail_after(60):
        async with serving(api_server, tmp_path, key("alice", concurrency=1), behaviour=slow) as (
            srv, client,
        ):  # fmt: skip
            parts = urlsplit(srv.url)
            assert parts.hostname is not None
            body = json.dumps({**GENERATE, "stream": True, "options": {"num_predict": 1000}})
            stream = await trio.open_tcp_stream(parts.hostname, parts.port)
            async with stream:
                await stream.send_all(
                    b"POST /api/generate HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                    b"Content-Length: %d\r\n\r\n%s"
                    % (parts.netloc.encode(), SECRETS["alice"].encode(), len(body), body.encode())
                )
                data = b""
                while b'"response"' not in data:  # a token has come: the stream runs
                    data += await stream.receive_some(65536)
                assert data.startswith(b"HTTP/1.1 200")
                r = await client.get("/api/tags", headers=as_key("alice"))
                assert r.status_code == 429
                assert r.json()["error"].startswith("rate limit reached: 1 concurrent requests")
                assert r.headers["retry-after"] == "1"
            # The client left mid-stream: its place is given back (once the server has
            # seen it leave).
            r = await client.get("/api/tags", headers=as_key("alice"))
            while r.status_code == 429:
                r = await client.get("/api/tags", headers=as_key("alice"))
            # With one place, an answer means the left stream's place was given back.
            assert r.status_code == 200


async def test_a_running_stream_is_never_cut(api_server: Any, tmp_path: Path) -> None:
    slow = SimulatedBehaviour(load_seconds=0.01, tokens_per_second=100)
    alice = key("alice", rpm=1, tpm=5)
    with trio.fail_after(60):
        async with serving(api_server, tmp_path, alice, behaviour=slow) as (_, client):
            body = {**GENERATE, "stream": True, "options": {"num_predict": 30}}
            lines = []
            async with client.stream(
                "POST", "/api/generate", json=body, headers=as_key("alice")
            ) as stream:
                async for line in stream.aiter_lines():
                    lines.append(json.loads(line))
                    if len(lines) == 2:  # both limits are reached while it runs
                        r = await client.post("/api/chat", json=CHAT, headers=as_key("alice"))
                        assert r.status_code == 429
            tokens = [line for line in lines if "load_progress" not in line]
            assert len(tokens) == 31
            assert tokens[-1]["done"]
            assert tokens[-1]["eval_count"] == 30


# -- usage --------------------------------------------------------------------------------


async def test_usage_totals_and_days_survive_a_restart(api_server: Any, tmp_path: Path) -> None:
    alice, bob = key("alice"), key("bob", rpm=1)
    with trio.fail_after(60):
        async with serving(api_server, tmp_path, alice, bob) as (_, client):
            body = {**GENERATE, "options": {"num_predict": 5}}
            r = await client.post("/api/generate", json=body, headers=as_key("alice"))
            prompt = r.json()["prompt_eval_count"]
            r = await client.post(
                "/v1/chat/completions",
                json={**CHAT, "stream": True, "max_tokens": 3},
                headers=as_key("alice"),
            )
            assert r.status_code == 200
            r = await client.post(
                "/api/embed", json={"model": "tiny-embed", "input": "a b c"},
                headers=as_key("alice"),
            )  # fmt: skip
            embedded = r.json()["prompt_eval_count"]
            assert embedded > 0
            for _ in range(3):
                await client.get("/api/tags", headers=as_key("bob"))
            document = (await client.get("/api/usage", headers=as_key("alice"))).json()
            used = usage_of(document, "alice")
            assert used["since_start"] == used["total"]
            total = used["total"]
            assert total["requests"] == 3
            assert total["generated_tokens"] == 5 + 3
            assert total["prompt_tokens"] + total["prompt_tokens_reused"] > prompt + embedded
            bob_total = usage_of(document, "bob")["total"]
            assert bob_total["requests"] == 1
            assert bob_total["refusals"]["rate_limited_rpm"] == 2
            assert [k["name"] for k in document["keys"]] == ["alice", "bob"]
            # More after the last answer: written by the writer, or at shutdown at the latest.
            await client.post("/api/generate", json=body, headers=as_key("alice"))
        async with serving(api_server, tmp_path, alice, bob) as (_, client):
            document = (await client.get("/api/usage", headers=as_key("alice"))).json()
            used = usage_of(document, "alice")
            assert used["since_start"]["requests"] == 0
            assert used["total"]["requests"] == 4 + 1  # and this server's /api/usage
            assert used["total"]["generated_tokens"] == 5 + 3 + 5
            (day,) = used["days"]
            assert day["requests"] == used["total"]["requests"]
            assert usage_of(document, "bob")["days"][0]["refusals"]["rate_limited_rpm"] == 2


def key_series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("ollamatrio_key_")
        for s in family.samples
    }


async def test_metrics_per_key_series(api_server: Any, tmp_path: Path) -> None:
    ops = ApiKey("ops", "", frozenset({"metrics"}))
    with trio.fail_after(60):
        async with serving(
            api_server, tmp_path / "state", key("alice"), key("bob", rpm=1), ops
        ) as (_, client):
            # A key's series appear once it was used (the reading itself counts once done).
            assert key_series((await client.get("/metrics", headers=as_key("ops"))).text) == {}
            body = {**GENERATE, "options": {"num_predict": 4}}
            await client.post("/api/generate", json=body, headers=as_key("alice"))
            await client.get("/api/tags", headers=as_key("bob"))
            await client.get("/api/tags", headers=as_key("bob"))
            series = key_series((await client.get("/metrics", headers=as_key("ops"))).text)
            alice, bob, reader = (("key", "alice"),), (("key", "bob"),), (("key", "ops"),)
            assert series[("ollamatrio_key_requests_total", alice)] == 1
            assert series[("ollamatrio_key_tokens_generated_total", alice)] == 4
            assert series[("ollamatrio_key_prompt_tokens_total", alice)] > 0
            assert series[("ollamatrio_key_requests_total", bob)] == 1
            assert series[("ollamatrio_key_requests_total", reader)] == 1
            refused = (("cause", "rate_limited_rpm"), ("key", "bob"))
            assert series[("ollamatrio_key_refusals_total", refused)] == 1
            assert {labels for _, labels in series} == {alice, bob, reader, refused}
            # A request without a key is refused and counted under no key's name.
            assert (await client.post("/api/chat", json=CHAT)).status_code == 401
            series = key_series((await client.get("/metrics", headers=as_key("ops"))).text)
            nobody = (("cause", "unauthorized"), ("key", "-"))
            assert series[("ollamatrio_key_refusals_total", nobody)] == 1
