"""``/api/pull`` through the real server: the official ``ollama`` client against a fake
registry on 127.0.0.1 (nothing leaves the machine)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
import trio

from ollamatrio.api.app import drain_of
from ollamatrio.store import MEDIA_MODEL, MEDIA_TEMPLATE
from ollamatrio.store import registry as registry_module
from ollamatrio.testing.fake_registry import FakeRegistry
from ollamatrio.testing.tiny_gguf import CHATML

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
async def registry(nursery: trio.Nursery) -> FakeRegistry:
    fake = FakeRegistry()
    await nursery.start(fake.serve)
    return fake


@pytest.fixture
def published(registry: FakeRegistry, tiny_gguf: Callable[..., Path]) -> str:
    gguf = tiny_gguf(layers=3).read_bytes()
    registry.add_model(
        "library/pulled:latest", [(MEDIA_MODEL, gguf), (MEDIA_TEMPLATE, b"{{ .Prompt }}")]
    )
    return registry.model_name("library/pulled:latest")


@asynccontextmanager
async def running(api_server: Any) -> AsyncIterator[tuple[Any, ollama.AsyncClient]]:
    async with api_server() as srv, ollama.AsyncClient(host=srv.url) as client:
        yield srv, client


async def test_pull_without_streaming_then_list_and_show(api_server: Any, published: str) -> None:
    with trio.fail_after(30):
        async with running(api_server) as (srv, client):
            result = await client.pull(published, insecure=True)
            assert result.status == "success"

            names = [m.model for m in (await client.list()).models]
            assert published in names
            shown = await client.show(published)
            # The template generation applies: the GGUF's own wins over a Go layer.
            assert shown.template == CHATML
            assert srv.store.resolve(published).model_path is not None


async def test_pull_streaming_progress(
    api_server: Any, published: str, registry: FakeRegistry
) -> None:
    with trio.fail_after(30):
        async with running(api_server) as (_srv, client):
            events = [e async for e in await client.pull(published, insecure=True, stream=True)]

    statuses = [e.status for e in events]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    manifest = json.loads(registry.manifests["library/pulled:latest"])
    for layer in [*manifest["layers"], manifest["config"]]:
        mine = [e for e in events if e.digest == layer["digest"]]
        assert mine[-1].status == f"pulling {layer['digest'][7:19]}"
        assert (mine[-1].total, mine[-1].completed) == (layer["size"], layer["size"])


async def test_pulling_an_unknown_model_fails_like_ollama(
    api_server: Any, registry: FakeRegistry
) -> None:
    name = registry.model_name("library/missing:latest")
    with trio.fail_after(30):
        async with running(api_server) as (_srv, client):
            with pytest.raises(ollama.ResponseError) as blocking:
                await client.pull(name, insecure=True)
            assert blocking.value.status_code == 500
            assert blocking.value.error == "pull model manifest: file does not exist"

            with pytest.raises(ollama.ResponseError) as streaming:
                async for _ in await client.pull(name, insecure=True, stream=True):
                    pass
            assert streaming.value.error == "pull model manifest: file does not exist"


async def test_a_present_model_pulls_offline_and_a_newer_manifest_still_updates(
    api_server: Any, published: str, registry: FakeRegistry, tiny_gguf: Callable[..., Path]
) -> None:
    """A model in the store keeps its local copy when its registry does not know the name
    or cannot be reached (a status line says so, then success); a newer manifest is still
    pulled as usual.  A model that is not in the store still fails."""
    # Port 1 on the loopback: nothing listens, the connection is refused at once.
    unreachable = "127.0.0.1:1/library/offline:latest"
    with trio.fail_after(30):
        async with running(api_server) as (srv, client):
            await client.pull(published, insecure=True)
            digest = srv.store.resolve(published).digest

            del registry.manifests["library/pulled:latest"]
            events = [e async for e in await client.pull(published, insecure=True, stream=True)]
            assert [e.status for e in events] == [
                "pulling manifest",
                "pull model manifest: file does not exist; using the local copy",
                "success",
            ]
            assert srv.store.resolve(published).digest == digest

            await client.copy(published, unreachable)
            events = [e async for e in await client.pull(unreachable, insecure=True, stream=True)]
            assert events[-1].status == "success"
            assert events[-2].status.startswith("pull model manifest: ")
            assert events[-2].status.endswith("; using the local copy")
            assert (await client.pull(unreachable, insecure=True)).status == "success"

            gguf = tiny_gguf(layers=4).read_bytes()
            registry.add_model("library/pulled:latest", [(MEDIA_MODEL, gguf)])
            events = [e async for e in await client.pull(published, insecure=True, stream=True)]
            assert events[-1].status == "success"
            assert "writing manifest" in [e.status for e in events]
            assert srv.store.resolve(published).digest != digest

            with pytest.raises(ollama.ResponseError) as caught:
                await client.pull("127.0.0.1:1/library/absent:latest", insecure=True)
            assert caught.value.error.startswith("pull model manifest: ")


async def test_invalid_name_is_a_400(api_server: Any) -> None:
    with trio.fail_after(30):
        async with running(api_server) as (_srv, client):
            with pytest.raises(ollama.ResponseError) as caught:
                await client.pull("bad name!", insecure=True)
            assert caught.value.status_code == 400


async def test_client_that_goes_away_stops_the_pull(
    api_server: Any, registry: FakeRegistry
) -> None:
    data = os.urandom(4 << 20)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    name = registry.model_name("library/big:latest")
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    registry.chunk_delay = 0.02  # about 1.3 s for the whole blob

    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as http:
            body = {"model": name, "insecure": True}
            async with http.stream("POST", "/api/pull", json=body) as response:
                async for line in response.aiter_lines():
                    if json.loads(line).get("completed"):
                        break  # leave with the download under way
            await registry.wait_streams_idle()

            assert registry.bytes_served[digest] < len(data)
            assert not srv.store.exists(name)


@pytest.fixture
def pull_ended(monkeypatch: pytest.MonkeyPatch) -> trio.Event:
    """Set when a pull task (in the app's nursery) has ended, whichever way."""
    ended = trio.Event()
    task = registry_module._pull_task

    async def watched(*args: Any) -> None:
        try:
            await task(*args)
        finally:
            ended.set()

    monkeypatch.setattr(registry_module, "_pull_task", watched)
    return ended


@pytest.fixture
def slow_model(registry: FakeRegistry) -> tuple[str, str, int]:
    """A 4 MiB model served slowly (about 1.3 s): (name, blob digest, size)."""
    data = os.urandom(4 << 20)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    registry.chunk_delay = 0.02
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    return registry.model_name("library/big:latest"), digest, len(data)


async def test_client_gone_right_after_the_head_stops_the_pull(
    api_server: Any, registry: FakeRegistry, slow_model: tuple[str, str, int],
    pull_ended: trio.Event,
) -> None:  # fmt: skip
    name, digest, size = slow_model
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as http:
            body = {"model": name, "insecure": True}
            async with http.stream("POST", "/api/pull", json=body) as response:
                assert response.status_code == 200  # and leave without reading a line
            with trio.fail_after(5):
                await pull_ended.wait()  # its channel was closed: it stopped
            await registry.wait_streams_idle()
            assert registry.bytes_served[digest] < size
            assert not srv.store.exists(name)


async def test_shutdown_cuts_a_long_pull_with_a_last_error_line(
    api_server: Any, registry: FakeRegistry, slow_model: tuple[str, str, int],
    pull_ended: trio.Event,
) -> None:  # fmt: skip
    name, _digest, _size = slow_model
    lines: list[dict[str, Any]] = []
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as http:
            body = {"model": name, "insecure": True}
            async with http.stream("POST", "/api/pull", json=body) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    lines.append(json.loads(line))
                    if lines[-1].get("completed"):
                        drain_of(srv.app).cut()  # the grace period is over
            with trio.fail_after(5):
                await pull_ended.wait()
            assert not srv.store.exists(name)
    assert lines[-1] == {"error": "server shutting down"}
    assert all("error" not in line for line in lines[:-1])


async def test_an_invalid_name_is_a_400_before_the_stream_starts(api_server: Any) -> None:
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as http:
            for stream in (True, False):
                r = await http.post("/api/pull", json={"model": "bad name!", "stream": stream})
                assert r.status_code == 400
                assert r.headers["content-type"] == "application/json; charset=utf-8"
                assert "error" in r.json()
