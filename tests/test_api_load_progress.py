"""Progress lines on streamed native generations that wait for a load: real hypercorn on
port 0, the simulated engine in virtual time (the clock jumps only after 30 ms of real
idleness, so socket work always finishes first), and the official ``ollama`` client."""

from __future__ import annotations

import json
from typing import Any

import httpx
import ollama
import trio

from ollamatrio.engines.simulated import LOAD_STEPS, SimulatedBehaviour

SLOW_LOAD = SimulatedBehaviour(load_seconds=2, tokens_per_second=100)


async def stream(c: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[int, list[Any]]:
    async with c.stream("POST", path, json=body) as r:
        return r.status_code, [json.loads(line) async for line in r.aiter_lines() if line]


def progress(lines: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(p["completed"], p["total"]) for line in lines if (p := line.get("load_progress"))]


async def test_a_stream_that_waits_for_a_load_gets_progress_lines_first(
    autojump_clock, api_server
) -> None:
    autojump_clock.autojump_threshold = 0.1
    body = {"model": "tiny", "prompt": "x", "options": {"num_predict": 3}}
    with trio.fail_after(600):
        async with api_server(behaviour=SLOW_LOAD) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=None) as c:
                status, first = await stream(c, "/api/generate", body)
                status_again, again = await stream(c, "/api/generate", body)
    assert status == status_again == 200
    seen = progress(first)
    total = seen[0][1]
    assert total > 0
    assert seen == [(total * i // LOAD_STEPS, total) for i in range(LOAD_STEPS + 1)]
    n = len(seen)
    assert all(line["response"] == "" and line["done"] is False for line in first[:n])
    assert first[0]["model"] == "tiny"
    assert first[0]["created_at"].endswith("Z")
    assert "load_progress" not in json.dumps(first[n:])
    assert "".join(line["response"] for line in first[n:]).strip()
    assert first[-1]["done"] is True
    assert progress(again) == []  # loaded: nothing extra
    assert len(again) == len(first) - n


async def test_chat_progress_lines_carry_an_empty_assistant_message(
    autojump_clock, api_server
) -> None:
    autojump_clock.autojump_threshold = 0.1
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    with trio.fail_after(600):
        async with api_server(behaviour=SLOW_LOAD) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=None) as c:
                _, lines = await stream(c, "/api/chat", body)
    first = lines[0]
    assert first["message"] == {"role": "assistant", "content": ""}
    assert first["load_progress"]["completed"] == 0
    assert "response" not in first
    assert progress(lines)[-1][0] == progress(lines)[-1][1]


async def test_the_ollama_client_parses_a_stream_with_progress_lines(
    autojump_clock, api_server
) -> None:
    autojump_clock.autojump_threshold = 0.1
    with trio.fail_after(600):
        async with api_server(behaviour=SLOW_LOAD) as srv, ollama.AsyncClient(host=srv.url) as c:
            parts = [p async for p in await c.generate("tiny", "x", stream=True)]
            await c.generate("tiny", keep_alive=0)  # unload
            chat = [
                p async for p in await c.chat(
                    "tiny", [{"role": "user", "content": "hi"}], stream=True
                )
            ]  # fmt: skip
    assert len(parts) > LOAD_STEPS + 1
    assert [p.response for p in parts[: LOAD_STEPS + 1]] == [""] * (LOAD_STEPS + 1)
    assert "".join(p.response for p in parts).strip()
    assert parts[-1].done
    assert parts[-1].done_reason == "stop"
    assert chat[0].message.content == ""
    assert chat[0].message.role == "assistant"
    assert "".join(p.message.content or "" for p in chat).strip()
    assert chat[-1].done


async def test_openai_streams_and_unstreamed_answers_get_no_progress(
    autojump_clock, api_server
) -> None:
    autojump_clock.autojump_threshold = 0.1
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with trio.fail_after(600):
        async with api_server(behaviour=SLOW_LOAD) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=None) as c:
                async with c.stream("POST", "/v1/chat/completions", json=chat) as r:
                    text = "".join([chunk async for chunk in r.aiter_text()])
                await c.post("/api/generate", json={"model": "tiny", "keep_alive": 0})
                r = await c.post(
                    "/api/generate", json={"model": "tiny", "prompt": "x", "stream": False}
                )
    assert "load_progress" not in text
    assert text.rstrip().endswith("data: [DONE]")
    assert r.status_code == 200
    assert "load_progress" not in r.json()
    assert r.json()["done"] is True


async def test_a_load_that_fails_after_the_stream_started_ends_it_with_an_error_line(
    autojump_clock, api_server
) -> None:
    autojump_clock.autojump_threshold = 0.1
    failing = SimulatedBehaviour(load_seconds=2, fail_load="error")
    with trio.fail_after(600):
        async with api_server(behaviour=failing) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=None) as c:
                status, lines = await stream(c, "/api/generate", {"model": "tiny", "prompt": "x"})
                r = await c.post(
                    "/api/generate", json={"model": "tiny", "prompt": "x", "stream": False}
                )
    assert status == 200
    assert progress(lines)[0][0] == 0
    assert "error loading model" in lines[-1]["error"]
    assert r.status_code == 500  # without a stream, the status says it as before
