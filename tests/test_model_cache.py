"""Resolved models served from memory: the store's per-manifest cache and the server's
catalog, and what invalidates each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from ollamatrio.api.models import REVALIDATE_AFTER, ApiContext
from ollamatrio.config import Settings
from ollamatrio.errors import ModelNotFoundError
from ollamatrio.store import ModelStore, import_gguf

TinyGGUF = Callable[..., Path]


def imported(store: ModelStore, name: str, path: Path, **create_args: object) -> None:
    for _ in import_gguf(store, name, path, **create_args):
        pass


@pytest.fixture
def store(tmp_path: Path, tiny_gguf: TinyGGUF) -> ModelStore:
    store = ModelStore(tmp_path / "models")
    for name in ("alpha", "beta"):
        imported(store, name, tiny_gguf())
    return store


def count_manifest_reads(store: ModelStore, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    reads: list[Path] = []
    original = store._read_manifest

    def counting(path: Path):  # type: ignore[no-untyped-def]
        reads.append(path)
        return original(path)

    monkeypatch.setattr(store, "_read_manifest", counting)
    return reads


def test_unchanged_manifests_are_not_read_again(
    store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.list()
    store.resolve("alpha")
    reads = count_manifest_reads(store, monkeypatch)
    for _ in range(3):
        assert sorted(m.short_name for m in store.list()) == ["alpha:latest", "beta:latest"]
        assert store.resolve("alpha").short_name == "alpha:latest"
    assert reads == []


def test_another_writer_is_seen_through_the_manifest_identity(
    store: ModelStore, tiny_gguf: TinyGGUF
) -> None:
    before = store.resolve("alpha")
    other = ModelStore(store.root)  # another process on the same directory
    imported(other, "alpha", tiny_gguf(), system="You are terse.")
    after = store.resolve("alpha")
    assert before.system is None
    assert after.system == "You are terse."
    assert after.digest != before.digest


def test_listing_checks_blobs_when_a_cached_model_is_resolved(store: ModelStore) -> None:
    (model, *_) = store.list()  # cached without looking at the blobs
    assert model.model_path is not None
    model.model_path.unlink()
    with pytest.raises(ModelNotFoundError, match="incomplete"):
        store.resolve(model.short_name)


def test_writes_bump_the_generation(store: ModelStore) -> None:
    start = store.generation
    store.copy("alpha", "gamma")
    store.delete("gamma")
    assert store.generation == start + 2


@pytest.fixture
def ctx(store: ModelStore) -> ApiContext:
    return ApiContext(scheduler=None, store=store, settings=Settings())  # type: ignore[arg-type]


async def test_catalog_serves_from_memory_until_revalidation(
    autojump_clock: trio.testing.MockClock,
    ctx: ApiContext,
    store: ModelStore,
    tiny_gguf: TinyGGUF,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await ctx.resolve("alpha")
    await ctx.list_models()
    calls: list[str] = []
    for method in ("resolve", "list"):
        original = getattr(store, method)

        def counted(*args, _original=original, _method=method):  # type: ignore[no-untyped-def]
            calls.append(_method)
            return _original(*args)

        monkeypatch.setattr(store, method, counted)
    for _ in range(5):
        await ctx.resolve("alpha")
        assert len(await ctx.list_models()) == 2
    assert calls == []

    # Another process rewrites alpha: seen once the revalidation interval has passed.
    other = ModelStore(store.root)
    imported(other, "alpha", tiny_gguf(), system="Changed elsewhere.")
    assert (await ctx.resolve("alpha")).system is None
    await trio.sleep(REVALIDATE_AFTER)
    assert (await ctx.resolve("alpha")).system == "Changed elsewhere."
    assert calls == ["resolve"]


async def test_catalog_sees_this_process_writes_at_once(
    autojump_clock: trio.testing.MockClock, ctx: ApiContext, store: ModelStore
) -> None:
    assert len(await ctx.list_models()) == 2
    await ctx.resolve("alpha")
    await trio.to_thread.run_sync(store.copy, "alpha", "gamma")
    assert sorted(m.short_name for m in await ctx.list_models()) == [
        "alpha:latest",
        "beta:latest",
        "gamma:latest",
    ]
    await trio.to_thread.run_sync(store.delete, "alpha")
    with pytest.raises(ModelNotFoundError):
        await ctx.resolve("alpha")
    assert len(await ctx.list_models()) == 2
