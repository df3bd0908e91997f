"""The config file at server start-up: preloading beside a listener that is ready at once,
what ``/api/ps`` shows for a configured model, and a bad file as one line from ``serve``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_api_serve
import trio

from ollamatrio.config import Settings
from ollamatrio.engines.protocol import Engine
from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngineFactory
from ollamatrio.store import ModelStore
from ollamatrio.types import LoadSpec

CONFIG = """
[models.absent]
preload = true

[models.tiny]
pinned = true
preload = true
num_parallel = 2
num_ctx = 1024
"""


class GatedEngines:
    """Simulated engines whose loads wait until the test opens the gate."""

    def __init__(self, inner: SimulatedEngineFactory) -> None:
        self.inner = inner
        self.asked = trio.Event()
        self.gate = trio.Event()
        self.opened = trio.Event()

    @asynccontextmanager
    async def open(self, spec: LoadSpec, **kw: Any) -> AsyncIterator[Engine]:
        self.asked.set()
        await self.gate.wait()
        async with self.inner.open(spec, **kw) as engine:
            self.opened.set()
            yield engine

    async def keep_spare(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self.inner.keep_spare(task_status=task_status)


async def test_preload_loads_in_the_background_with_the_models_settings(
    tmp_path: Path, tiny_gguf, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = tmp_path / "ollamatrio.toml"
    config.write_text(CONFIG)
    settings = Settings(
        host="127.0.0.1", port=0, models_dir=tmp_path / "models", config_path=config
    )
    test_api_serve.import_model(ModelStore(settings.models_dir), "tiny", tiny_gguf())
    inner, devices = test_api_serve._engines(SimulatedBehaviour(load_seconds=0.01))
    engines = GatedEngines(inner)
    stop = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery, httpx.AsyncClient() as client:
            url = await test_api_serve.start_serve(nursery, settings, stop, engines, devices)  # type: ignore[arg-type]
            await engines.asked.wait()  # the preload is loading ...
            version = await client.get(f"{url}/api/version")
            assert version.status_code == 200  # ... and the API answers meanwhile
            (shown,) = (await client.get(f"{url}/api/ps")).json()["models"]
            assert (shown["name"], shown["state"]) == ("tiny:latest", "loading")

            engines.gate.set()
            await engines.opened.wait()
            (shown,) = (await client.get(f"{url}/api/ps")).json()["models"]
            assert {k: shown[k] for k in ("state", "pinned", "slots", "context_length")} == {
                "state": "ready", "pinned": True, "slots": 2, "context_length": 1024,
            }  # fmt: skip
            assert shown["expires_at"].startswith("2318-")  # Ollama's "forever"
            # A request's keep_alive 0 does not unload a pinned model ...
            body = {"model": "tiny", "prompt": "hi", "keep_alive": 0, "stream": False}
            assert (await client.post(f"{url}/api/generate", json=body)).status_code == 200
            assert len((await client.get(f"{url}/api/ps")).json()["models"]) == 1
            # ... an explicit unload request does.
            body = {"model": "tiny", "keep_alive": 0}
            assert (await client.post(f"{url}/api/generate", json=body)).json()["done_reason"] == (
                "unload"
            )
            states = [m["state"] for m in (await client.get(f"{url}/api/ps")).json()["models"]]
            assert states in ([], ["unloading"])
            stop.set()
    assert inner.loads == 1
    assert inner.engines == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"{config}: model absent is not in the store (yet)" in warnings
    assert "preloading absent failed: model 'absent' not found" in warnings
    assert "preloaded tiny" in caplog.messages


def test_serve_with_a_bad_config_file_says_so_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "ollamatrio.toml"
    config.write_text('[models."llama3.2"]\nkeep_alive = "10x"\n')
    env = {
        "OLLAMA_HOST": "127.0.0.1:0",
        "OLLAMA_MODELS": str(tmp_path / "models"),
        "OLLAMATRIO_CONFIG": str(config),
    }
    line = test_api_serve._serve_fails(env)
    assert line == (
        f'Error: {config}: models."llama3.2".keep_alive: time: unknown unit "x" in duration "10x"\n'
    )


def test_serve_with_a_missing_config_file_says_so_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "nope.toml"
    env = {"OLLAMA_HOST": "127.0.0.1:0", "OLLAMATRIO_CONFIG": str(config),
           "OLLAMA_MODELS": str(tmp_path / "models")}  # fmt: skip
    line = test_api_serve._serve_fails(env)
    assert line == f"Error: {config}: cannot read: no such file or directory\n"
