"""Pushing models to a registry: chunked uploads, blobs it has skipped, resume after a cut
connection or a stopped push, the token handshake, and the failures a push reports.

Every test talks to :class:`FakeRegistry` on 127.0.0.1 (port 0); nothing leaves the machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import import_model

from ollamatrio.errors import ModelNotFoundError
from ollamatrio.store import ModelStore
from ollamatrio.store.push import PushError, UploadOptions, push_progress, start_push
from ollamatrio.store.registry import pull_progress
from ollamatrio.store.registry_auth import RegistryAuthError
from ollamatrio.testing.fake_registry import FakeRegistry, Stall

REPO = "library/tiny:latest"
# Small chunks so that a tiny model's weights take several PATCHes; quick retries.
FAST = UploadOptions(
    chunk_size=8 << 10, block_size=2 << 10, backoff_base=0.01, backoff_max=0.05, heartbeat=0.05
)

Events = list[dict[str, Any]]


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


@pytest.fixture
async def registry(nursery: trio.Nursery) -> FakeRegistry:
    fake = FakeRegistry()
    await nursery.start(fake.serve)
    return fake


@pytest.fixture
def name(store: ModelStore, registry: FakeRegistry, tiny_gguf: Callable[..., Path]) -> str:
    """A model in ``store`` named for the registry (weights, template, system, params)."""
    model = registry.model_name(REPO)
    import_model(store, model, tiny_gguf(layers=3), system="Be brief.", parameters={"top_k": 7})
    assert store.blob_path(weights(store, model)).stat().st_size > 4 * FAST.chunk_size
    return model


def weights(store: ModelStore, name: str) -> str:
    return store.read_manifest(name).layers[0].digest


async def push(
    store: ModelStore, name: str, options: UploadOptions = FAST, *, deadline: float = 30
) -> Events:
    events: Events = []
    with trio.fail_after(deadline):
        async with push_progress(store, name, insecure=True, options=options) as stream:
            async for event in stream:
                events.append(event)
    return events


def store_files(store: ModelStore) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(store.root)), p.stat().st_size)
                  for p in store.root.rglob("*") if p.is_file())  # fmt: skip


def requests_of(registry: FakeRegistry, method: str) -> list[str | None]:
    return [r.range for r in registry.requests if r.method == method]


# -- a whole push ---------------------------------------------------------------------------


async def test_push_then_pull_into_a_second_store_gives_the_same_model(
    store: ModelStore, registry: FakeRegistry, name: str, tmp_path: Path
) -> None:
    events = await push(store, name)

    raw = store.manifest_path(name).read_bytes()
    assert registry.manifests[REPO] == raw  # the manifest as stored, published last
    manifest = store.read_manifest(name)
    for layer in manifest.all_layers():
        assert registry.blobs[layer.digest] == store.blob_path(layer.digest).read_bytes()
    statuses = [e["status"] for e in events]
    assert statuses[0] == "retrieving manifest"
    assert statuses[-2:] == ["pushing manifest", "success"]
    # The layers, then the config (Ollama's order), each ending complete.
    order = list(dict.fromkeys(e["digest"] for e in events if "digest" in e))
    assert order == [*(layer.digest for layer in manifest.layers), manifest.config.digest]  # type: ignore[union-attr]
    for layer in manifest.all_layers():
        last = [e for e in events if e.get("digest") == layer.digest][-1]
        assert last == {
            "status": f"pushing {layer.digest[7:19]}",
            "digest": layer.digest,
            "total": layer.size,
            "completed": layer.size,
        }
    # The weights went in chunks, in order, each from where the last ended.
    size = store.blob_path(weights(store, name)).stat().st_size
    chunks = [r for r in requests_of(registry, "PATCH") if r]
    starts = [int(r.split("-")[0]) for r in chunks[: -(-size // FAST.chunk_size)]]
    assert starts == list(range(0, size, FAST.chunk_size))
    assert registry.bytes_received == manifest.size  # nothing sent twice

    second = ModelStore(tmp_path / "second")
    async with pull_progress(second, name, insecure=True) as pulled:
        async for _ in pulled:
            pass
    assert second.manifest_path(name).read_bytes() == raw
    for layer in manifest.all_layers():
        assert second.blob_path(layer.digest).read_bytes() == (
            store.blob_path(layer.digest).read_bytes()
        )


async def test_blobs_the_registry_has_are_not_sent(
    store: ModelStore, registry: FakeRegistry, name: str
) -> None:
    digest = weights(store, name)
    registry.add_blob(store.blob_path(digest).read_bytes())
    events = await push(store, name)

    mine = [e for e in events if e.get("digest") == digest]
    size = store.blob_path(digest).stat().st_size
    assert mine == [
        {"status": f"pushing {digest[7:19]}", "digest": digest, "total": size, "completed": size}
    ]
    assert registry.bytes_received == store.read_manifest(name).size - size
    assert next(r.path for r in registry.requests if r.method == "HEAD").endswith(digest)
    # A second push finds every blob there: it sends none, only the manifest again.
    registry.bytes_received = 0
    await push(store, name)
    assert registry.bytes_received == 0


async def test_a_connection_cut_mid_chunk_resumes_from_the_registrys_range(
    store: ModelStore, registry: FakeRegistry, name: str
) -> None:
    cut = FAST.chunk_size + 3000  # in the second chunk
    registry.upload_drops = [cut]
    events = await push(store, name)

    assert events[-1] == {"status": "success"}
    gets = [r for r in registry.requests if r.method == "GET" and "/uploads/" in r.path]
    assert [g.status for g in gets] == [204]  # asked where the upload stood...
    chunks = [r for r in requests_of(registry, "PATCH") if r]  # those answered: not the cut one
    assert chunks[:2] == [f"0-{FAST.chunk_size - 1}", f"{cut}-{cut + FAST.chunk_size - 1}"]
    assert registry.bytes_received == store.read_manifest(name).size  # nothing sent twice
    assert registry.manifests[REPO] == store.manifest_path(name).read_bytes()


async def test_a_stopped_push_is_resumed_by_the_next_one(
    store: ModelStore, registry: FakeRegistry, name: str
) -> None:
    stall = registry.upload_stall = Stall(after=FAST.chunk_size + 5000, seconds=60)
    before = store_files(store)
    with trio.fail_after(30):
        async with push_progress(store, name, insecure=True, options=FAST) as events:
            async for _ in events:
                if stall.began.is_set():
                    break  # the client goes: the push stops
    assert stall.began.is_set()
    assert REPO not in registry.manifests  # nothing published by a push cut short
    assert store_files(store) == before  # and nothing changed here
    held = len(next(iter(registry.uploads.values())))
    assert held == FAST.chunk_size + 5000

    registry.bytes_received = 0
    await push(store, name)
    gets = [r for r in registry.requests if r.method == "GET" and "/uploads/" in r.path]
    assert [g.status for g in gets] == [204]
    assert registry.bytes_received == store.read_manifest(name).size - held
    assert registry.manifests[REPO] == store.manifest_path(name).read_bytes()


async def test_a_stalled_chunk_is_sent_again_from_the_registrys_range(
    store: ModelStore, registry: FakeRegistry, name: str
) -> None:
    stall = registry.upload_stall = Stall(after=5000, seconds=60)  # then nothing moves
    options = UploadOptions(
        chunk_size=FAST.chunk_size, backoff_base=0.01, backoff_max=0.05, stall_timeout=0.5
    )
    events = await push(store, name, options)
    assert stall.began.is_set()
    assert events[-1] == {"status": "success"}
    chunks = [r for r in requests_of(registry, "PATCH") if r]
    assert chunks[0].startswith("5000-")  # the first one went quiet: no answer
    assert registry.bytes_received == store.read_manifest(name).size


async def test_a_transient_server_error_is_retried(
    store: ModelStore, registry: FakeRegistry, name: str
) -> None:
    registry.push_faults = {"POST": [503], "PATCH": [500], "MANIFEST": [502]}
    events = await push(store, name)
    assert events[-1] == {"status": "success"}
    assert registry.manifests[REPO] == store.manifest_path(name).read_bytes()


# -- authentication -------------------------------------------------------------------------


async def test_a_registry_asking_for_a_token_gets_one(
    store: ModelStore, registry: FakeRegistry, name: str, tmp_path: Path
) -> None:
    registry.token = "s3cret"
    events = await push(store, name)
    assert events[-1] == {"status": "success"}
    assert [r.status for r in registry.requests if r.path == "/token"] == [200]
    assert [r.status for r in registry.requests].count(401) == 1  # then the token is kept
    # The pull shares the registry client, and so the handshake.
    second = ModelStore(tmp_path / "second")
    async with pull_progress(second, name, insecure=True) as pulled:
        assert [e async for e in pulled][-1] == {"status": "success"}


async def test_a_401_without_a_way_to_authenticate_is_a_clear_error(
    store: ModelStore, registry: FakeRegistry, name: str
) -> None:
    registry.token, registry.token_realm = "s3cret", False
    before = store_files(store)
    with pytest.raises(
        PushError, match=r"unauthorized: access denied \(the registry asks for Basic"
    ):
        await push(store, name)
    assert registry.manifests == {}
    assert registry.uploads == {}
    assert store_files(store) == before
    assert not store._pins  # every pin released


async def test_a_realm_on_another_host_is_refused(
    store: ModelStore, registry: FakeRegistry, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.token = "s3cret"
    monkeypatch.setattr(registry, "_challenge", lambda path: 'Bearer realm="http://elsewhere/t"')
    with pytest.raises(RegistryAuthError, match="realm host 'elsewhere' does not match"):
        await push(store, name)
    assert not [r for r in registry.requests if r.path == "/token"]


# -- failures ---------------------------------------------------------------------------------


async def test_a_registry_that_keeps_failing_is_a_clear_error_and_nothing_is_published(
    store: ModelStore, registry: FakeRegistry, name: str
) -> None:
    registry.push_faults = {"PATCH": [500] * 100}
    before = store_files(store)
    with pytest.raises(PushError, match=r"max retries exceeded: push [0-9a-f]{12}: 500: "):
        await push(store, name)
    assert REPO not in registry.manifests
    assert store_files(store) == before
    assert not store._pins


async def test_a_manifest_the_registry_refuses_is_reported(
    store: ModelStore, registry: FakeRegistry, name: str
) -> None:
    registry.push_faults = {"MANIFEST": [400]}
    with pytest.raises(PushError, match=r"push manifest: 400: .*INJECTED"):
        await push(store, name)
    assert REPO not in registry.manifests


async def test_an_unknown_model_is_not_found(
    store: ModelStore, registry: FakeRegistry, nursery: trio.Nursery
) -> None:
    name = registry.model_name("library/nope")
    with pytest.raises(ModelNotFoundError):
        await push(store, name)
    with trio.fail_after(30), start_push(nursery, store, name) as channel:
        events = [event async for event in channel]
    assert events[:2] == [
        {"status": "retrieving manifest"},
        {"status": "couldn't retrieve manifest"},
    ]
    assert events[2:] == [{"error": f'model "{name}" not found, try pulling it first'}]
    assert registry.requests == []


async def test_start_push_reports_a_failure_as_its_last_event(
    store: ModelStore, registry: FakeRegistry, name: str, nursery: trio.Nursery
) -> None:
    registry.token, registry.token_realm = "s3cret", False
    with trio.fail_after(30), start_push(nursery, store, name, insecure=True, options=FAST) as ch:
        events = [event async for event in ch]
    assert events[0] == {"status": "retrieving manifest"}
    assert "unauthorized" in events[-1]["error"]
