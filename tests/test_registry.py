"""Pulling models from a registry: protocol, progress, resume, parallel parts, failures.

Every test talks to :class:`FakeRegistry` on 127.0.0.1 (port 0); nothing leaves the machine.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from ollamatrio.store import (
    MEDIA_MODEL,
    MEDIA_PARAMS,
    MEDIA_SYSTEM,
    MEDIA_TEMPLATE,
    InvalidModelNameError,
    ModelStore,
    import_gguf,
)
from ollamatrio.store.download import DownloadOptions, Part, PullError, plan_parts
from ollamatrio.store.registry import open_registry_client, pull_progress, start_pull
from ollamatrio.testing.fake_registry import FakeRegistry, Stall

TEMPLATE = b"{{ .System }}<|user|>{{ .Prompt }}<|assistant|>"
PARAMS = b'{"stop":["<|user|>"],"temperature":0.2}\n'
MB = 1000 * 1000
# Quick retries: the default backoff (1 s, doubling) suits a real network, not a test.
FAST = DownloadOptions(backoff_base=0.01, backoff_max=0.05)

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
def gguf_bytes(tiny_gguf: Callable[..., Path]) -> bytes:
    return tiny_gguf().read_bytes()


def publish_tiny(registry: FakeRegistry, gguf: bytes, repo: str = "library/tiny:latest") -> str:
    registry.add_model(
        repo, [(MEDIA_MODEL, gguf), (MEDIA_TEMPLATE, TEMPLATE), (MEDIA_PARAMS, PARAMS)]
    )
    return registry.model_name(repo)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


async def pull(
    store: ModelStore,
    name: str,
    options: DownloadOptions = FAST,
    *,
    deadline: float = 30,
    **kwargs: Any,
) -> Events:
    events: Events = []
    with trio.fail_after(deadline):
        async with pull_progress(store, name, insecure=True, options=options, **kwargs) as stream:
            async for event in stream:
                events.append(event)
    return events


def blob_files(store: ModelStore) -> list[str]:
    return sorted(p.name for p in store.blobs_dir.iterdir())


def partial_record(store: ModelStore, digest: str, n: int = 0) -> dict[str, int]:
    name = digest.replace(":", "-") + f"-partial-{n}"
    return json.loads((store.blobs_dir / name).read_bytes())


def blob_gets(registry: FakeRegistry, digest: str) -> list[str | None]:
    return [r.range for r in registry.requests if r.method == "GET" and r.path.endswith(digest)]


# -- a whole pull ---------------------------------------------------------------------------


async def test_pull_small_model_then_resolve(
    store: ModelStore, registry: FakeRegistry, gguf_bytes: bytes
) -> None:
    name = publish_tiny(registry, gguf_bytes)
    events = await pull(store, name)

    model = store.resolve(name)
    assert model.model_path is not None
    assert model.model_path.read_bytes() == gguf_bytes
    assert model.template == TEMPLATE.decode()
    assert model.params == {"stop": ["<|user|>"], "temperature": 0.2}
    served = registry.manifests["library/tiny:latest"]
    assert store.manifest_path(name).read_bytes() == served  # written as served
    assert model.digest == hashlib.sha256(served).hexdigest()
    assert all("-partial" not in f for f in blob_files(store))

    statuses = [e["status"] for e in events]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    # Layers in manifest order, then the config, one after another (as Ollama does).
    order = list(dict.fromkeys(e["digest"] for e in events if "digest" in e))
    assert order == [layer.digest for layer in model.manifest.all_layers()]


async def test_progress_events_carry_ollama_fields(
    store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(3 * MB)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    options = DownloadOptions(min_part_size=256 << 10, write_buffer=64 << 10)
    events = await pull(store, registry.model_name("library/big:latest"), options)

    digest = digest_of(data)
    mine = [e for e in events if e.get("digest") == digest]
    assert len(mine) > 5  # one event per write (coalesced if the reader lags), not per blob
    for event in mine:
        assert event["status"] == f"pulling {digest[7:19]}"
        assert event["total"] == len(data)
        assert set(event) <= {"status", "digest", "total", "completed"}
    completed = [e.get("completed", 0) for e in mine]  # 0 is left out, as Go's omitempty
    assert completed == sorted(completed)
    assert completed[-1] == len(data)


async def test_blobs_already_present_are_reported_complete_and_not_fetched(
    store: ModelStore, registry: FakeRegistry, gguf_bytes: bytes
) -> None:
    first = publish_tiny(registry, gguf_bytes, "library/tiny:latest")
    await pull(store, first)
    registry.add_model("library/tiny:v2", [(MEDIA_MODEL, gguf_bytes), (MEDIA_TEMPLATE, b"other")])
    registry.requests.clear()

    events = await pull(store, registry.model_name("library/tiny:v2"))

    gguf = digest_of(gguf_bytes)
    assert blob_gets(registry, gguf) == []
    assert registry.bytes_served[gguf] == len(gguf_bytes)  # from the first pull only
    (hit,) = [e for e in events if e.get("digest") == gguf]
    assert hit == {
        "status": f"pulling {gguf[7:19]}",
        "digest": gguf,
        "total": len(gguf_bytes),
        "completed": len(gguf_bytes),
    }
    assert store.resolve(registry.model_name("library/tiny:v2")).template == "other"


async def test_pulling_a_newer_version_removes_layers_nothing_uses(
    store: ModelStore, registry: FakeRegistry, gguf_bytes: bytes
) -> None:
    name = publish_tiny(registry, gguf_bytes)
    await pull(store, name)
    registry.add_model("library/tiny:latest", [(MEDIA_MODEL, gguf_bytes), (MEDIA_TEMPLATE, b"new")])

    events = await pull(store, name)

    assert {"status": "removing unused layers"} in events
    assert not store.has_blob(digest_of(TEMPLATE))
    assert not store.has_blob(digest_of(PARAMS))
    assert store.has_blob(digest_of(gguf_bytes))
    assert store.resolve(name).template == "new"


# -- failures ------------------------------------------------------------------------------


async def test_unknown_model_is_ollamas_manifest_error(
    store: ModelStore, registry: FakeRegistry
) -> None:
    with pytest.raises(PullError, match=r"^pull model manifest: file does not exist$"):
        await pull(store, registry.model_name("library/nothing:latest"))
    assert store.list() == []


async def test_unreachable_registry_is_a_clear_manifest_error(store: ModelStore) -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    with pytest.raises(PullError, match=r"^pull model manifest: .+"):
        await pull(store, f"127.0.0.1:{port}/library/tiny")


async def test_corrupt_blob_fails_and_leaves_no_model(
    store: ModelStore, registry: FakeRegistry, gguf_bytes: bytes
) -> None:
    name = publish_tiny(registry, gguf_bytes)
    gguf = digest_of(gguf_bytes)
    registry.corrupt.add(gguf)

    with pytest.raises(PullError) as caught:
        await pull(store, name)

    assert str(caught.value).startswith(
        f"digest mismatch, file must be downloaded again: want {gguf}, got sha256:"
    )
    assert not store.exists(name)
    assert not store.has_blob(gguf)
    assert not any(f.startswith(gguf.replace(":", "-")) for f in blob_files(store))
    # Fixed upstream, the next pull starts that blob over and succeeds.
    registry.corrupt.clear()
    await pull(store, name)
    assert store.resolve(name).model_path.read_bytes() == gguf_bytes  # type: ignore[union-attr]


async def test_interrupted_download_resumes_where_it_stopped(
    store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(3 * MB)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    name = registry.model_name("library/big:latest")
    digest = digest_of(data)
    registry.drop_after[digest] = [1 * MB]
    one_try = DownloadOptions(max_retries=1)

    with pytest.raises(PullError, match="max retries exceeded"):
        await pull(store, name, one_try)

    assert not store.exists(name)
    assert not store.has_blob(digest)
    # Ollama's partial layout, so either server can resume it.
    assert partial_record(store, digest) == {
        "N": 0,
        "Offset": 0,
        "Size": len(data),
        "Completed": 1 * MB,
    }
    assert registry.bytes_served[digest] == 1 * MB

    await pull(store, name, one_try)

    assert registry.bytes_served[digest] == len(data)  # the rest, not the whole blob again
    assert blob_gets(registry, digest)[-1] == f"bytes={1 * MB}-{len(data) - 1}"
    assert store.resolve(name).model_path.read_bytes() == data  # type: ignore[union-attr]
    assert not any("partial" in f for f in blob_files(store))


async def test_dropped_connection_is_retried_from_the_last_byte(
    store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(2 * MB)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    digest = digest_of(data)
    registry.drop_after[digest] = [300_000, 700_000]

    await pull(store, registry.model_name("library/big:latest"))

    assert blob_gets(registry, digest) == [
        f"bytes=0-{len(data) - 1}",
        f"bytes=300000-{len(data) - 1}",
        f"bytes=1000000-{len(data) - 1}",
    ]
    assert registry.bytes_served[digest] == len(data)
    assert store.has_blob(digest)


async def test_registry_that_ignores_range_still_resumes(
    store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(1 * MB)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    digest = digest_of(data)
    registry.ignore_range = True
    registry.drop_after[digest] = [400_000]

    await pull(store, registry.model_name("library/big:latest"))

    assert registry.bytes_served[digest] == 400_000 + len(data)  # the skipped prefix too
    assert store.blob_path(digest).read_bytes() == data


async def test_parallel_parts_reassemble_in_a_bounded_number_at_a_time(
    store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(4 << 20)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    digest = digest_of(data)
    options = DownloadOptions(min_part_size=256 << 10, max_concurrent_parts=3)
    registry.chunk_delay = 0.001  # let parts overlap

    await pull(store, registry.model_name("library/big:latest"), options)

    assert store.blob_path(digest).read_bytes() == data
    part = 256 << 10
    expected = [f"bytes={o}-{min(o + part, len(data)) - 1}" for o in range(0, len(data), part)]
    assert sorted(blob_gets(registry, digest)) == sorted(expected)  # 16 parts, once each
    assert 2 <= registry.peak_streams <= 3
    assert registry.bytes_served[digest] == len(data)


@pytest.mark.parametrize(
    ("total", "options", "sizes"),
    [
        (0, DownloadOptions(), []),
        (50 * MB, DownloadOptions(), [50 * MB]),
        (250 * MB, DownloadOptions(), [100 * MB, 100 * MB, 50 * MB]),
        (3200 * MB, DownloadOptions(), [200 * MB] * 16),
        (32_000 * MB, DownloadOptions(), [1000 * MB] * 32),
        (10, DownloadOptions(min_part_size=4), [4, 4, 2]),
    ],
    ids=["empty", "one-part", "min-size", "sixteen", "max-size", "remainder"],
)
def test_parts_are_split_like_ollama(
    total: int, options: DownloadOptions, sizes: list[int]
) -> None:
    parts = plan_parts(total, options)
    assert [p.size for p in parts] == sizes
    assert [p.n for p in parts] == list(range(len(sizes)))
    assert all(a.stop == b.offset for a, b in itertools.pairwise(parts))


async def test_unusable_partial_records_restart_the_download(
    store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(600_000)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    digest = digest_of(data)
    stem = store.blobs_dir / (digest.replace(":", "-") + "-partial")
    stem.write_bytes(b"\0" * 100)
    (stem.parent / (stem.name + "-0")).write_bytes(Part(0, 0, 123).to_json(50))  # wrong size

    await pull(store, registry.model_name("library/big:latest"))

    assert blob_gets(registry, digest) == [f"bytes=0-{len(data) - 1}"]
    assert store.blob_path(digest).read_bytes() == data


# -- cancellation and stalls ---------------------------------------------------------------


async def test_cancelled_pull_leaves_only_resumable_partials(
    store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(2 * MB)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    name = registry.model_name("library/big:latest")
    digest = digest_of(data)
    registry.stalls[digest] = [Stall(after=500_000, seconds=3600)]
    options = DownloadOptions(write_buffer=64 << 10)

    with trio.fail_after(30):
        async with pull_progress(store, name, insecure=True, options=options) as events:
            async for event in events:
                if event.get("completed", 0) >= 400_000:
                    break  # leaving the block cancels the pull

    assert not store.exists(name)
    assert not store.has_blob(digest)
    kept = partial_record(store, digest)["Completed"]
    assert 400_000 <= kept <= 500_000

    registry.requests.clear()
    await pull(store, name, options)

    assert blob_gets(registry, digest) == [f"bytes={kept}-{len(data) - 1}"]
    assert store.resolve(name).model_path.read_bytes() == data  # type: ignore[union-attr]


@pytest.fixture
def jumpy_clock() -> trio.testing.MockClock:
    # Virtual time with real sockets: jump only once everything has been idle for 50 ms
    # of real time, so socket I/O is never mistaken for a stall.
    return trio.testing.MockClock(autojump_threshold=0.05)


async def test_stalled_part_is_restarted_after_the_stall_timeout(
    jumpy_clock: trio.testing.MockClock, store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(1 * MB)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    digest = digest_of(data)
    registry.stalls[digest] = [Stall(after=300_000, seconds=10_000)]
    options = DownloadOptions(write_buffer=100_000, stall_timeout=30, heartbeat=600)

    start = trio.current_time()
    await pull(store, registry.model_name("library/big:latest"), options, deadline=300)

    assert trio.current_time() - start >= 30  # virtual seconds: the stall timeout ran out
    gets = blob_gets(registry, digest)
    assert gets[0] == f"bytes=0-{len(data) - 1}"
    assert gets[1] == f"bytes=300000-{len(data) - 1}"  # restarted after the bytes kept
    assert store.blob_path(digest).read_bytes() == data


# -- start_pull, for the HTTP server -------------------------------------------------------


async def test_start_pull_streams_events_then_closes(
    nursery: trio.Nursery, store: ModelStore, registry: FakeRegistry, gguf_bytes: bytes
) -> None:
    name = publish_tiny(registry, gguf_bytes)
    with trio.fail_after(30):
        events = [e async for e in start_pull(nursery, store, name, insecure=True, options=FAST)]
    assert events[0] == {"status": "pulling manifest"}
    assert events[-1] == {"status": "success"}
    assert store.exists(name)


async def test_start_pull_reports_failure_as_a_last_error_event(
    nursery: trio.Nursery, store: ModelStore, registry: FakeRegistry
) -> None:
    name = registry.model_name("library/nothing:latest")
    with trio.fail_after(30):
        events = [e async for e in start_pull(nursery, store, name, insecure=True)]
    assert events == [
        {"status": "pulling manifest"},
        {"error": "pull model manifest: file does not exist"},
    ]


async def test_closing_the_channel_stops_the_pull(
    store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(2 * MB)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    name = registry.model_name("library/big:latest")
    digest = digest_of(data)
    registry.stalls[digest] = [Stall(after=300_000, seconds=3600)]  # never finishes on its own
    options = DownloadOptions(write_buffer=64 << 10, heartbeat=0.05)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:  # exits only once the pull task has ended
            events = start_pull(nursery, store, name, insecure=True, options=options)
            async for event in events:
                if event.get("completed"):
                    events.close()  # the client went away
                    break

    assert not store.exists(name)
    assert partial_record(store, digest)["Completed"] > 0


async def test_concurrent_pulls_of_one_model_download_each_blob_once(
    store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(1 * MB)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    name = registry.model_name("library/big:latest")
    registry.chunk_delay = 0.002
    results: list[Events] = []

    async def one() -> None:
        results.append(await pull(store, name))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one)
        nursery.start_soon(one)

    digest = digest_of(data)
    assert registry.bytes_served[digest] == len(data)
    for events in results:
        assert events[-1] == {"status": "success"}
        assert [e for e in events if e.get("digest") == digest][-1]["completed"] == len(data)
    assert store.blob_path(digest).read_bytes() == data


# -- protocol details ----------------------------------------------------------------------


async def test_blobs_follow_a_redirect_to_another_host(
    store: ModelStore, registry: FakeRegistry, gguf_bytes: bytes
) -> None:
    name = publish_tiny(registry, gguf_bytes)
    registry.redirect_to_host = "localhost"  # the same server under another name, as a CDN

    await pull(store, name)

    gguf = digest_of(gguf_bytes)
    paths = [(r.method, r.path, r.status) for r in registry.requests if gguf in r.path]
    assert paths == [
        ("GET", f"/v2/library/tiny/blobs/{gguf}", 307),
        ("GET", f"/direct/{gguf}", 206),
    ]
    assert store.resolve(name).model_path.read_bytes() == gguf_bytes  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("insecure", "scheme"), [(False, "https"), (True, "http")], ids=["default", "insecure"]
)
async def test_manifest_request_scheme_and_accept_header(
    store: ModelStore, insecure: bool, scheme: str
) -> None:
    seen: list[httpx.Request] = []

    def registry_app(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(404)

    async with open_registry_client(transport=httpx.MockTransport(registry_app)) as client:
        with pytest.raises(PullError, match="file does not exist"), trio.fail_after(5):
            async with pull_progress(
                store, "example.com/team/model:q4", insecure=insecure, client=client
            ) as events:
                async for _ in events:
                    pass

    (request,) = seen
    assert str(request.url) == f"{scheme}://example.com/v2/team/model/manifests/q4"
    assert request.headers["accept"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert request.headers["user-agent"].startswith("ollamatrio/")


async def test_start_pull_refuses_an_invalid_name_before_starting(
    nursery: trio.Nursery, store: ModelStore
) -> None:
    with pytest.raises(InvalidModelNameError):
        start_pull(nursery, store, "bad name!")


async def test_empty_layer_is_pulled_and_verified(
    store: ModelStore, registry: FakeRegistry
) -> None:
    registry.add_model("library/blank:latest", [(MEDIA_MODEL, b"GGUF"), (MEDIA_SYSTEM, b"")])
    name = registry.model_name("library/blank:latest")

    await pull(store, name)

    assert store.resolve(name).system == ""
    assert store.has_blob(digest_of(b""))


async def test_registry_serves_an_ollama_models_directory(
    tmp_path: Path, store: ModelStore, registry: FakeRegistry, tiny_gguf: Callable[..., Path]
) -> None:
    source = ModelStore(tmp_path / "source")

    def import_model() -> None:
        for _ in import_gguf(source, "team/tiny:q8", tiny_gguf(), template="{{ .Prompt }}"):
            pass

    await trio.to_thread.run_sync(import_model)
    assert registry.add_models_dir(source.root) == ["team/tiny:q8"]
    name = registry.model_name("team/tiny:q8")

    await pull(store, name)

    pulled = store.resolve(name)
    original = source.resolve("team/tiny:q8")
    assert pulled.digest == original.digest  # the very same manifest bytes
    assert pulled.model_path.read_bytes() == tiny_gguf().read_bytes()  # type: ignore[union-attr]
    assert pulled.template == "{{ .Prompt }}"


@pytest.mark.parametrize(
    ("faults", "error"),
    [
        ([503, 502], None),
        ([429], None),
        ([503] * 6, r"^max retries exceeded: download [0-9a-f]{12}: 503: .*injected 503"),
        ([403], r"^download [0-9a-f]{12}: 403: .*injected 403"),
        ([404], r"^download [0-9a-f]{12}: file does not exist$"),
    ],
    ids=["5xx-retried", "429-retried", "5xx-gives-up", "403-fatal", "404-fatal"],
)
async def test_blob_http_errors(
    store: ModelStore, registry: FakeRegistry, faults: list[int], error: str | None
) -> None:
    data = os.urandom(100_000)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    name = registry.model_name("library/big:latest")
    registry.status_faults[digest_of(data)] = list(faults)

    if error is None:
        await pull(store, name)
        assert store.blob_path(digest_of(data)).read_bytes() == data
    else:
        with pytest.raises(PullError, match=error):
            await pull(store, name)
        assert not store.exists(name)


async def test_manifest_server_error_is_reported_with_status_and_body(
    store: ModelStore, registry: FakeRegistry
) -> None:
    registry.add_model("library/big:latest", [(MEDIA_MODEL, b"GGUF")])
    registry.status_faults["library/big:latest"] = [500]
    with pytest.raises(PullError, match=r'^pull model manifest: 500: \{"errors".*injected 500'):
        await pull(store, registry.model_name("library/big:latest"))


async def test_a_retry_asks_the_registry_again_for_a_fresh_redirect(
    store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(500_000)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    digest = digest_of(data)
    registry.redirect_to_host = "localhost"
    registry.drop_after[digest] = [200_000]

    await pull(store, registry.model_name("library/big:latest"))

    assert [
        (r.path.split("/")[1], r.range, r.status) for r in registry.requests if digest in r.path
    ] == [
        ("v2", f"bytes=0-{len(data) - 1}", 307),
        ("direct", f"bytes=0-{len(data) - 1}", 206),
        ("v2", f"bytes=200000-{len(data) - 1}", 307),
        ("direct", f"bytes=200000-{len(data) - 1}", 206),
    ]
    assert store.blob_path(digest).read_bytes() == data


async def test_resume_from_ollama_style_records_of_several_parts(
    store: ModelStore, registry: FakeRegistry
) -> None:
    data = os.urandom(3_000_000)
    registry.add_model("library/big:latest", [(MEDIA_MODEL, data)])
    digest = digest_of(data)
    # What an interrupted Ollama (or ollamatrio) leaves: parts done, half done, not begun.
    stem = store.blobs_dir / (digest.replace(":", "-") + "-partial")
    records = [Part(0, 0, 1_000_000, 1_000_000), Part(1, 1_000_000, 1_000_000, 400_000)]
    records.append(Part(2, 2_000_000, 1_000_000, 0))
    stem.write_bytes(b"".join(
        data[p.offset : p.start] + bytes(p.size - p.completed) for p in records
    ))  # fmt: skip
    for part in records:
        (stem.parent / f"{stem.name}-{part.n}").write_bytes(part.to_json())

    await pull(store, registry.model_name("library/big:latest"))

    assert sorted(blob_gets(registry, digest)) == ["bytes=1400000-1999999", "bytes=2000000-2999999"]
    assert registry.bytes_served[digest] == 1_600_000
    assert store.blob_path(digest).read_bytes() == data
    assert not any("partial" in f for f in blob_files(store))
