"""The on-disk prompt cache without runners: the state file's tokens, the index, its bound.

State files here are written the way llama.cpp writes them (magic, version, token count,
llama-server's packed token record, then KV bytes), with filler as the KV data.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import pytest

from ollamatrio.slot_cache import SlotCache, cache_key, read_state_tokens
from ollamatrio.slot_cache.statefile import MAGIC
from ollamatrio.types import LoadSpec

KEY = "k" * 64
OTHER_KEY = "o" * 64


def state_bytes(tokens: list[int], *, kv: int = 1000, packed: bool = True, media: int = 0) -> bytes:
    record = [-1, 1, len(tokens), *tokens, media] if packed else tokens
    head = struct.pack("<III", MAGIC, 4, len(record))
    return head + struct.pack(f"<{len(record)}i", *record) + b"\xab" * kv


def save(
    cache: SlotCache, tokens: list[int], *, key: str = KEY, model: Path, kv: int = 1000
) -> str | None:
    """What a runner's save and the engine's commit do together."""
    temp = cache.temp_name()
    (cache.ensure_folder() / temp).write_bytes(state_bytes(tokens, kv=kv))
    return cache.commit(temp, key=key, model_path=str(model), n_saved=len(tokens))


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "blobs" / "sha256-abc"
    path.parent.mkdir()
    path.write_bytes(b"GGUF")
    return path


@pytest.fixture
def cache(tmp_path: Path) -> SlotCache:
    return SlotCache(tmp_path / "prompt-cache", 1 << 20)


# -- the state file's tokens -----------------------------------------------------------


def test_reads_the_packed_token_record(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    path.write_bytes(state_bytes([5, 6, 7]))
    assert read_state_tokens(path, 3) == [5, 6, 7]
    assert read_state_tokens(path) == [5, 6, 7]


def test_reads_bare_tokens_of_older_servers(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    path.write_bytes(state_bytes([5, 6, 7], packed=False))
    assert read_state_tokens(path, 3) == [5, 6, 7]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"GGUF" + bytes(20), id="wrong magic"),
        pytest.param(state_bytes([5, 6, 7], kv=0)[:20], id="cut in the tokens"),
        pytest.param(state_bytes([5, 6, 7], media=1), id="holds images"),
        pytest.param(struct.pack("<III", MAGIC, 4, 1 << 30), id="absurd count"),
    ],
)
def test_unreadable_state_files_read_as_none(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "s.bin"
    path.write_bytes(data)
    assert read_state_tokens(path) is None


def test_a_count_other_than_the_saved_one_reads_as_none(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    path.write_bytes(state_bytes([5, 6, 7]))
    assert read_state_tokens(path, 4) is None


# -- the index ---------------------------------------------------------------------------


def test_a_committed_state_is_private_and_found_by_its_prefix(
    cache: SlotCache, model: Path
) -> None:
    name = save(cache, list(range(300)), model=model)
    assert name is not None
    assert not name.startswith("tmp-")
    assert stat.S_IMODE(os.stat(cache.folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cache.folder / name).st_mode) == 0o600
    assert [p.name for p in cache.folder.glob("tmp-*")] == []
    match = cache.find(KEY, [*range(280), 9999, 9998], minimum=256)
    assert match is not None
    assert (match.name, match.shared, match.n_tokens) == (name, 280, 300)


def test_a_state_is_never_offered_under_another_key(cache: SlotCache, model: Path) -> None:
    save(cache, list(range(300)), model=model)
    assert cache.find(OTHER_KEY, list(range(300)), minimum=1) is None
    assert cache.count(OTHER_KEY) == 0


def test_a_short_shared_prefix_is_not_offered(cache: SlotCache, model: Path) -> None:
    save(cache, list(range(300)), model=model)
    assert cache.find(KEY, [*range(100), 7777], minimum=256) is None


def test_the_longest_shared_prefix_wins(cache: SlotCache, model: Path) -> None:
    a = save(cache, [*range(300), *([1] * 50)], model=model)
    b = save(cache, [*range(300), *([2] * 50)], model=model)
    assert a is not None
    assert b is not None
    assert a != b
    match = cache.find(KEY, [*range(300), *([2] * 60)], minimum=256)
    assert match is not None
    assert match.name == b


def test_a_continued_conversation_replaces_its_earlier_state(cache: SlotCache, model: Path) -> None:
    first = save(cache, list(range(300)), model=model)
    longer = save(cache, list(range(400)), model=model)
    assert first is not None
    assert longer is not None
    assert cache.usage()[0] == 1
    assert not (cache.folder / first).exists()
    # And an earlier prefix of a kept state is not added again.
    assert save(cache, list(range(350)), model=model) is None
    assert cache.usage()[0] == 1


def test_the_bound_evicts_the_least_recently_used(tmp_path: Path, model: Path) -> None:
    cache = SlotCache(tmp_path / "pc", 3 * 1000 + 3 * 1400)  # about three states
    names = [save(cache, [n, *range(300)], model=model) for n in range(1000, 1003)]
    assert all(names)
    # Using the oldest makes the second the least recently used.
    assert cache.find(KEY, [1000, *range(300)], minimum=256) is not None
    fourth = save(cache, [1003, *range(300)], model=model)
    kept = {p.name for p in cache.folder.glob("*.bin")}
    assert kept == {names[0], names[2], fourth}
    assert cache.usage()[1] <= cache.limit


def test_a_state_larger_than_the_bound_is_not_kept(tmp_path: Path, model: Path) -> None:
    cache = SlotCache(tmp_path / "pc", 2000)
    assert save(cache, list(range(300)), model=model, kv=5000) is None
    assert list(cache.folder.glob("*.bin")) == []


def test_an_unreadable_save_is_dropped(cache: SlotCache, model: Path) -> None:
    temp = cache.temp_name()
    (cache.ensure_folder() / temp).write_bytes(b"not a state")
    assert cache.commit(temp, key=KEY, model_path=str(model), n_saved=3) is None
    assert not (cache.folder / temp).exists()


def test_a_truncated_state_is_dropped_when_looked_for(cache: SlotCache, model: Path) -> None:
    name = save(cache, list(range(300)), model=model)
    assert name is not None
    path = cache.folder / name
    path.write_bytes(path.read_bytes()[:500])
    assert cache.find(KEY, list(range(300)), minimum=256) is None
    assert not path.exists()
    assert cache.usage() == (0, 0)


def test_states_of_a_deleted_model_are_forgotten(cache: SlotCache, model: Path) -> None:
    name = save(cache, list(range(300)), model=model)
    assert cache.forget_missing() == 0
    model.unlink()
    assert cache.forget_missing() == 1
    assert name is not None
    assert not (cache.folder / name).exists()


def test_sweep_removes_cut_short_saves_and_applies_a_smaller_bound(
    tmp_path: Path, model: Path
) -> None:
    cache = SlotCache(tmp_path / "pc", 1 << 20)
    name = save(cache, list(range(300)), model=model)
    (cache.folder / cache.temp_name()).write_bytes(b"half a state")
    cache.sweep()
    assert {p.name for p in cache.folder.glob("*.bin")} == {name}
    SlotCache(cache.folder, 0).sweep()  # the cache turned off: everything goes
    assert list(cache.folder.glob("*.bin")) == []


def test_the_key_follows_everything_that_shapes_the_kv_cache() -> None:
    spec = LoadSpec(model_path="/store/blobs/sha256-aaa", name="m", num_ctx=4096)
    plan = {
        "n_batch": 512,
        "n_ubatch": 512,
        "flash_attention": "auto",
        "kv_cache_type_k": "f16",
        "kv_cache_type_v": "f16",
    }
    key = cache_key(spec, plan, 4096)
    assert cache_key(LoadSpec(model_path="/x/sha256-aaa", name="other"), plan, 4096) == key
    assert cache_key(spec, plan, 2048) != key
    assert cache_key(spec, {**plan, "kv_cache_type_k": "q8_0"}, 4096) != key
    assert cache_key(spec, {**plan, "kv_cache_type_v": "q8_0"}, 4096) != key
    assert cache_key(spec, {**plan, "flash_attention": "on"}, 4096) != key
    assert cache_key(spec, {**plan, "n_batch": 256}, 4096) != key
    other_model = LoadSpec(model_path="/store/blobs/sha256-bbb", name="m")
    assert cache_key(other_model, plan, 4096) != key
    with_adapter = LoadSpec(model_path=spec.model_path, name="m", adapters=("/b/sha256-l",))
    assert cache_key(with_adapter, plan, 4096) != key
