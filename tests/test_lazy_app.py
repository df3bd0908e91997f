"""The app built on first use (``api/lazy.py``): liveness answers before it exists, the same
answers as the app's, one build for concurrent first requests, its lifespan run and ended."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

from ollamatrio._version import OLLAMA_API_VERSION, __version__
from ollamatrio.api.lazy import LazyApp
from ollamatrio.config import Settings
from ollamatrio.devices import SimulatedDevices
from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngineFactory
from ollamatrio.http.front import serve_http
from ollamatrio.scheduler import open_scheduler
from ollamatrio.serve import hypercorn_config
from ollamatrio.store import ModelStore

SYSTEM = json.dumps({"gpus": [], "system": {"total": 64 << 30, "cpu_count": 2}})


@asynccontextmanager
async def lazy_server(tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[str, LazyApp]]:
    settings = replace(
        Settings(host="127.0.0.1", port=0, models_dir=tmp_path / "models"), **overrides
    )
    devices = SimulatedDevices(SYSTEM)
    engines = SimulatedEngineFactory(devices, default=SimulatedBehaviour(load_seconds=0.01))
    stop = trio.Event()
    async with (
        open_scheduler(settings, engines=engines, devices=devices) as scheduler,
        trio.open_nursery() as nursery,
    ):
        app = LazyApp(scheduler, ModelStore(settings.models_dir), settings)
        (url,) = await nursery.start(
            partial(serve_http, app, hypercorn_config(settings), shutdown_trigger=stop.wait)
        )
        try:
            yield url, app
        finally:
            stop.set()


async def test_liveness_answers_before_the_app_exists_as_the_app_does(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with lazy_server(tmp_path) as (url, app), httpx.AsyncClient(base_url=url) as c:
            early = await c.get("/api/version")
            root = await c.get("/")
            head = await c.head("/")
            assert not app.built
            assert early.json() == {"version": OLLAMA_API_VERSION, "ollamatrio": __version__}
            assert root.text == "Ollama is running"
            assert head.status_code == 200
            assert head.content == b""
            assert (await c.get("/api/tags")).json() == {"models": []}
            assert app.built
            late = await c.get("/api/version")
            assert late.content == early.content
            assert late.headers["content-type"] == early.headers["content-type"]


async def test_liveness_answers_keep_the_host_guard_and_cors(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with lazy_server(tmp_path) as (url, app), httpx.AsyncClient(base_url=url) as c:
            rebound = await c.get("/api/version", headers={"Host": "evil.example"})
            foreign = await c.get("/", headers={"Origin": "https://evil.example"})
            local = await c.get("/", headers={"Origin": "http://localhost:3000"})
            assert not app.built
    assert rebound.status_code == 403
    assert foreign.status_code == 403
    assert local.status_code == 200
    assert local.headers["access-control-allow-origin"] == "http://localhost:3000"


async def test_concurrent_first_requests_build_once_and_run_the_lifespan(tmp_path: Path) -> None:
    answers: list[int] = []
    with trio.fail_after(60):
        async with lazy_server(tmp_path) as (url, app), httpx.AsyncClient(base_url=url) as c:

            async def tags() -> None:
                answers.append((await c.get("/api/tags")).status_code)

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(tags)
            built = await app.app()
            assert built is await app.app()
            assert built.nursery is not None  # Quart-Trio's lifespan opened it (pulls run there)
            # A streamed route through the front door's view of them.
            r = await c.post("/api/generate", json={"model": "missing"})
            assert r.status_code == 404
    assert answers == [200] * 4
