"""``GET /api/events`` over real HTTP: what a request's life looks like, the model filter,
keep-alive pings, and that disconnects, shutdown and lagging end the stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio
from test_api_serve import _engines, import_model

from ollamatrio.config import Settings
from ollamatrio.engines.simulated import SimulatedBehaviour
from ollamatrio.observability import events as events_route
from ollamatrio.scheduler.events import SUBSCRIBER_BUFFER
from ollamatrio.serve import serve
from ollamatrio.store import ModelStore


async def read_events(
    lines: AsyncIterator[str] | httpx.Response, until: str, into: list[dict[str, Any]]
) -> None:
    """SSE frames (the data, or ``{"comment": ...}``) until an event of kind ``until``."""
    if isinstance(lines, httpx.Response):
        lines = lines.aiter_lines()
    kind = None
    async for line in lines:
        if line.startswith(": "):
            into.append({"comment": line[2:]})
        elif line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: ") :])
            assert data["event"] == kind
            into.append(data)
            if kind == until:
                return


async def test_a_requests_life_as_server_sent_events(api_server) -> None:
    seen: list[dict[str, Any]] = []
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url, timeout=None) as c:
            async with c.stream("GET", "/api/events") as r:
                assert r.status_code == 200
                assert r.headers["content-type"] == "text/event-stream"
                assert r.headers["cache-control"] == "no-cache"
                body = {"model": "tiny", "prompt": "x", "stream": False, "keep_alive": 0.05}
                assert (await c.post("/api/generate", json=body)).status_code == 200
                await read_events(r, "unloaded", seen)
            await srv.scheduler.events.wait_subscribers(0)  # the client left: unsubscribed
    kinds = [e["event"] for e in seen]
    assert kinds[:2] == ["queued", "loading"]
    assert kinds[-4:] == ["loading", "loaded", "expired", "unloaded"]
    assert set(kinds[1:-3]) == {"loading"}
    assert {e["model"] for e in seen} == {"tiny:latest"}
    progress = [(e["completed"], e["total"]) for e in seen if e["event"] == "loading"]
    assert progress[0][0] == 0
    assert progress[-1][0] == progress[-1][1] > 0


async def test_the_model_filter_and_keep_alive_pings(
    autojump_clock, api_server, monkeypatch
) -> None:
    # Real sockets and threads: the clock jumps only after a real pause long enough that a
    # loaded machine's slow I/O is not taken for idleness (a jump past fail_after's 600 s).
    autojump_clock.autojump_threshold = 0.1
    seen: list[dict[str, Any]] = []
    with trio.fail_after(600):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url, timeout=None) as c:
            # Names are compared as the store compares them: this is tiny-embed:latest.
            params = {"model": "library/Tiny-Embed"}
            async with c.stream("GET", "/api/events", params=params) as r:
                lines = r.aiter_lines()
                await c.post("/api/generate", json={"model": "tiny", "stream": False})
                await c.post("/api/embed", json={"model": "tiny-embed", "input": "x"})
                await read_events(lines, "loaded", seen)
                more: list[dict[str, Any]] = []
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read_events, lines, "never", more)
                    await trio.sleep(events_route.PING_SECONDS + 1)
                    nursery.cancel_scope.cancel()
    assert {e["model"] for e in seen} == {"tiny-embed:latest"}
    assert more == [{"comment": "ping"}]


async def test_a_client_that_leaves_is_unsubscribed(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            async with c.stream("GET", "/api/events") as r:
                assert r.status_code == 200
                hub = srv.scheduler.events
                await hub.wait_subscribers(1)
            await hub.wait_subscribers(0)  # the server learns of it through its own socket


async def test_a_laggard_is_cut_off_and_its_stream_ends(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            async with c.stream("GET", "/api/events") as r:
                hub = srv.scheduler.events
                await hub.wait_subscribers(1)
                # Without letting the stream task run: one event for its waiting receive,
                # a full buffer, and one more.
                for _ in range(SUBSCRIBER_BUFFER + 2):
                    srv.scheduler._publish("expired", "x", "x")
                assert hub.subscribers == 0  # cut off
                text = "".join([chunk async for chunk in r.aiter_text()])  # and it ends
    # The backlog (a full buffer, and the one a waiting receive took), then the end.
    assert SUBSCRIBER_BUFFER <= text.count("event: expired") <= SUBSCRIBER_BUFFER + 1


async def test_shutdown_ends_an_events_stream_at_once(tmp_path: Path, tiny_gguf) -> None:
    """``serve`` drains running requests for seconds at shutdown; an events stream must
    not hold that up: it ends cleanly as soon as shutdown begins."""
    settings = Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models")
    import_model(ModelStore(settings.models_dir), "tiny", tiny_gguf())
    engines, devices = _engines(SimulatedBehaviour(load_seconds=0.01))
    stop = trio.Event()
    with trio.fail_after(5):  # well under the drain's grace period
        async with trio.open_nursery() as nursery:
            (url,) = await nursery.start(
                partial(serve, settings, shutdown_trigger=stop.wait, engines=engines,
                        devices=devices)
            )  # fmt: skip
            async with httpx.AsyncClient(base_url=url, timeout=None) as c:
                async with c.stream("GET", "/api/events") as r:
                    stop.set()
                    rest = [line async for line in r.aiter_lines()]  # ends, no error
    assert rest == []


async def test_cors_and_host_guard_apply(api_server) -> None:
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as c:
            r = await c.get("/api/events", headers={"Origin": "https://evil.example"})
            assert r.status_code == 403
            r = await c.get("/api/events", headers={"Host": "evil.example"})
            assert r.status_code == 403
            async with c.stream(
                "GET", "/api/events", headers={"Origin": "http://localhost:3000"}
            ) as r:
                assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
