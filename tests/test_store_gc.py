"""Blob collection without a restart: after create, copy, delete and overwrite, whatever
the interleaving, no blob is left that no manifest references (and none a manifest needs
is taken)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from ollamatrio.errors import InvalidRequestError, ModelNotFoundError
from ollamatrio.store import ModelStore, create_model, import_gguf
from ollamatrio.testing.store_race import store_audit

TinyGGUF = Callable[..., Path]


@pytest.fixture
def store(tmp_path: Path, tiny_gguf: TinyGGUF) -> ModelStore:
    store = ModelStore(tmp_path / "models")
    for _ in import_gguf(store, "base", tiny_gguf()):
        pass
    return store


def orphans(store: ModelStore) -> tuple[str, ...]:
    audit = store_audit(store.root)
    assert audit.missing == ()
    return audit.orphans


def test_two_creates_of_one_name_leave_only_the_winner(store: ModelStore) -> None:
    first = create_model(store, "x", from_model="base", system="first")
    second = create_model(store, "x", from_model="base", system="second")
    next(first)  # each has looked at the store before either writes its manifest
    next(second)
    list(first)
    list(second)
    assert store.resolve("x").system == "second"
    assert orphans(store) == ()


def test_copy_over_a_model_drops_its_unshared_blobs(store: ModelStore) -> None:
    list(create_model(store, "x", from_model="base", system="only x"))
    only_x = store.resolve("x").manifest.digests() - store.resolve("base").manifest.digests()
    store.copy("base", "x")
    assert not any(store.has_blob(d) for d in only_x)
    assert orphans(store) == ()


def test_a_create_cut_short_leaves_nothing(store: ModelStore) -> None:
    before = store_audit(store.root).blobs
    steps = create_model(store, "x", from_model="base", system="never written")
    for step in steps:
        if step["status"] == "writing manifest":
            break  # every new layer is written; the manifest is not
    steps.close()  # what the API does when the client goes
    assert not store.exists("x")
    assert store_audit(store.root).blobs == before
    assert orphans(store) == ()


def test_a_failed_import_leaves_nothing(store: ModelStore, tiny_gguf: TinyGGUF) -> None:
    before = store_audit(store.root).blobs
    with pytest.raises(InvalidRequestError):  # the copied file is refused after the copy
        for _ in import_gguf(store, "y", tiny_gguf(seed=7), parameters="not an object"):
            pass
    assert store_audit(store.root).blobs == before
    assert orphans(store) == ()


def test_delete_while_a_create_holds_the_blobs(store: ModelStore) -> None:
    list(create_model(store, "x", from_model="base", system="x"))
    only_x = store.resolve("x").manifest.digests() - store.resolve("base").manifest.digests()
    # A create from x pins x's blobs; x is deleted meanwhile: its blobs stay while pinned...
    kept = create_model(store, "y", from_model="x")
    next(kept)
    lost = create_model(store, "z", from_model="x", system="z")
    next(lost)
    store.delete("x")
    assert all(store.has_blob(d) for d in only_x)
    # ... the create that finishes references them; the one cut short lets them go.
    lost.close()
    assert all(store.has_blob(d) for d in only_x)
    list(kept)
    assert store.resolve("y").system == "x"
    assert orphans(store) == ()
    store.delete("y")
    assert not any(store.has_blob(d) for d in only_x)
    assert orphans(store) == ()


def test_held_back_blobs_go_when_nothing_takes_them(store: ModelStore) -> None:
    list(create_model(store, "x", from_model="base", system="x"))
    only_x = store.resolve("x").manifest.digests() - store.resolve("base").manifest.digests()
    with store.pinned(only_x):
        store.delete("x")
        assert all(store.has_blob(d) for d in only_x)
    assert not any(store.has_blob(d) for d in only_x)
    assert store._held_back == set()


def test_noprune_keeps_the_blobs_of_an_overwritten_manifest(
    tmp_path: Path, tiny_gguf: TinyGGUF
) -> None:
    store = ModelStore(tmp_path / "models", noprune=True)
    for _ in import_gguf(store, "base", tiny_gguf()):
        pass
    list(create_model(store, "x", from_model="base", system="x"))
    old = store.resolve("x").manifest.digests()
    store.copy("base", "x")
    assert all(store.has_blob(d) for d in old)


async def test_threads_racing_on_the_same_names_leave_no_orphans(store: ModelStore) -> None:
    names = ("a", "b", "c")
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(40):
            try:
                kind = rng.choice(("create", "create", "copy", "delete"))
                if kind == "create":
                    source = rng.choice(("base", *names))
                    system = f"system {rng.randrange(20)}"
                    list(create_model(store, rng.choice(names), from_model=source, system=system))
                elif kind == "copy":
                    store.copy(rng.choice(("base", *names)), rng.choice(names))
                else:
                    store.delete(rng.choice(names))
            except ModelNotFoundError:
                pass  # another thread deleted it first
            except BaseException as exc:  # collected and re-raised in the test body
                errors.append(exc)

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for seed in range(8):
                nursery.start_soon(trio.to_thread.run_sync, work, seed)
    assert errors == []
    assert orphans(store) == ()
    for model in store.list():
        store.resolve(model.name)  # consistent: every blob a manifest names is there
    assert store._held_back == set()
    assert not store._pins
