"""``/api/push`` through the real server: the official ``ollama`` client against a fake
registry on 127.0.0.1 (nothing leaves the machine)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
import trio
from conftest import import_model

from ollamatrio.testing.fake_registry import FakeRegistry

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REPO = "library/mine:latest"


@pytest.fixture
async def registry(nursery: trio.Nursery) -> FakeRegistry:
    fake = FakeRegistry()
    await nursery.start(fake.serve)
    return fake


async def test_push_without_streaming_publishes_the_model(
    api_server: Any, registry: FakeRegistry, tiny_gguf: Callable[..., Path]
) -> None:
    name = registry.model_name(REPO)
    with trio.fail_after(30):
        async with api_server() as srv, ollama.AsyncClient(host=srv.url) as client:
            await trio.to_thread.run_sync(import_model, srv.store, name, tiny_gguf())
            result = await client.push(name, insecure=True)
            assert result.status == "success"
            assert registry.manifests[REPO] == srv.store.manifest_path(name).read_bytes()


async def test_push_streams_ollamas_progress(
    api_server: Any, registry: FakeRegistry, tiny_gguf: Callable[..., Path]
) -> None:
    name = registry.model_name(REPO)
    with trio.fail_after(30):
        async with api_server() as srv, ollama.AsyncClient(host=srv.url) as client:
            await trio.to_thread.run_sync(import_model, srv.store, name, tiny_gguf())
            events = [e async for e in await client.push(name, insecure=True, stream=True)]
            manifest = srv.store.read_manifest(name)

    statuses = [e.status for e in events]
    assert statuses[0] == "retrieving manifest"
    assert statuses[-2:] == ["pushing manifest", "success"]
    for layer in manifest.all_layers():
        mine = [e for e in events if e.digest == layer.digest]
        assert mine[-1].status == f"pushing {layer.digest[7:19]}"
        assert (mine[-1].total, mine[-1].completed) == (layer.size, layer.size)


async def test_a_registry_refusing_the_push_is_a_500_or_a_last_error_line(
    api_server: Any, registry: FakeRegistry, tiny_gguf: Callable[..., Path]
) -> None:
    registry.token, registry.token_realm = "s3cret", False
    name = registry.model_name(REPO)
    with trio.fail_after(30):
        async with api_server() as srv, ollama.AsyncClient(host=srv.url) as client:
            await trio.to_thread.run_sync(import_model, srv.store, name, tiny_gguf())
            with pytest.raises(ollama.ResponseError, match="unauthorized") as refused:
                await client.push(name, insecure=True)
            assert refused.value.status_code == 500
            async with httpx.AsyncClient(base_url=srv.url) as raw:
                r = await raw.post("/api/push", json={"model": name, "insecure": True})
    assert r.status_code == 200
    lines = [line for line in r.text.splitlines() if line]
    assert lines[0] == '{"status":"retrieving manifest"}'
    assert "unauthorized: access denied" in lines[-1]
    assert lines[-1].startswith('{"error":')
    assert registry.manifests == {}


async def test_push_of_an_unknown_model_and_without_a_model(api_server: Any) -> None:
    with trio.fail_after(30):
        async with api_server() as srv, httpx.AsyncClient(base_url=srv.url) as client:
            r = await client.post("/api/push", json={"model": "nope", "stream": False})
            assert r.status_code == 500
            assert r.json() == {"error": 'model "nope" not found, try pulling it first'}
            r = await client.post("/api/push", json={"model": "nope"})
            assert r.status_code == 200
            assert r.text.splitlines() == [
                '{"status":"retrieving manifest"}',
                '{"status":"couldn\'t retrieve manifest"}',
                '{"error":"model \\"nope\\" not found, try pulling it first"}',
            ]
            r = await client.post("/api/push", json={})
            assert (r.status_code, r.json()) == (400, {"error": "model is required"})
            r = await client.post("/api/push", json={"model": "a/b/c/d/e"})
            assert r.status_code == 400
