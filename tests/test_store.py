"""The model store: reading Ollama's layout, create/copy/delete/prune, digests, safety."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from helpers.read_only import read_only

from ollamatrio.errors import GGUFError, InvalidRequestError, ModelNotFoundError
from ollamatrio.store import (
    MEDIA_MODEL,
    Manifest,
    ModelName,
    ModelStore,
    PruneResult,
    StoreError,
    create_model,
    import_gguf,
    parse_digest,
)
from ollamatrio.store.create import human_number
from ollamatrio.store.manifest import go_json

TinyGGUF = Callable[..., Path]  # the tiny_gguf fixture's factory

TEMPLATE = "{{ .System }}<|user|>{{ .Prompt }}<|assistant|>"
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def put_blob(root: Path, data: bytes) -> str:
    """Write a blob the way Ollama leaves it on disk."""
    digest = sha(data)
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / digest.replace(":", "-")).write_bytes(data)
    return digest


def layer_json(media: str, data_or_digest: tuple[str, int]) -> str:
    digest, size = data_or_digest
    return (
        f'{{"mediaType":"application/vnd.ollama.image.{media}","digest":"{digest}","size":{size}}}'
    )


def write_ollama_model(
    root: Path, gguf: Path, *, model: str = "smollm2", tag: str = "135m"
) -> bytes:
    """A store entry byte for byte as Ollama writes one (Go's json.Encoder output)."""
    weights = gguf.read_bytes()
    texts = {
        "template": TEMPLATE.encode(),
        "system": b"You are a helpful assistant.",
        "params": b'{"stop":["\\u003c|im_end|\\u003e"],"temperature":0.2}\n',
        "license": b"Apache License 2.0",
        "messages": b'[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]\n',
    }
    layers = [layer_json("model", (put_blob(root, weights), len(weights)))]
    for media, data in texts.items():
        layers.append(layer_json(media, (put_blob(root, data), len(data))))
    diff_ids = [json.loads(layer)["digest"] for layer in layers]
    config = (
        '{"model_format":"gguf","model_family":"llama","model_families":["llama"],'
        '"model_type":"134.52M","file_type":"Q8_0","architecture":"amd64","os":"linux",'
        f'"rootfs":{{"type":"layers","diff_ids":{json.dumps(diff_ids, separators=(",", ":"))}}}}}\n'
    ).encode()
    config_digest = put_blob(root, config)
    manifest = (
        f'{{"schemaVersion":2,"mediaType":"{MANIFEST_TYPE}",'
        f'"config":{{"mediaType":"{CONFIG_TYPE}","digest":"{config_digest}","size":{len(config)}}},'
        f'"layers":[{",".join(layers)}]}}\n'
    ).encode()
    path = root / "manifests" / "registry.ollama.ai" / "library" / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(manifest)
    return manifest


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "models")


@pytest.fixture
def gguf_path(tiny_gguf: TinyGGUF) -> Path:
    return tiny_gguf()


def upload(store: ModelStore, path: Path) -> str:
    digest = sha(path.read_bytes())
    store.write_blob(digest, [path.read_bytes()])
    return digest


def statuses(progress: object) -> list[str]:
    return [p["status"] for p in progress]  # type: ignore[attr-defined, index]


def blob_names(store: ModelStore) -> set[str]:
    return {p.name for p in store.blobs_dir.iterdir()}


# -- reading a store Ollama wrote ------------------------------------------------------------


def test_reads_a_store_ollama_wrote(store: ModelStore, gguf_path: Path) -> None:
    manifest_bytes = write_ollama_model(store.root, gguf_path)
    model = store.resolve("smollm2:135m")
    assert model.name == ModelName.parse("smollm2:135m")
    assert model.short_name == "smollm2:135m"
    assert model.digest == hashlib.sha256(manifest_bytes).hexdigest()
    assert model.model_path is not None
    assert model.model_path.read_bytes() == gguf_path.read_bytes()
    assert model.template == TEMPLATE
    assert model.system == "You are a helpful assistant."
    assert model.params == {"stop": ["<|im_end|>"], "temperature": 0.2}
    assert model.license == ("Apache License 2.0",)
    assert [m["content"] for m in model.messages] == ["hi", "hello"]
    assert model.size == sum(layer.size for layer in model.manifest.all_layers())
    assert model.size > gguf_path.stat().st_size
    assert model.details.to_json() == {
        "parent_model": "",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "134.52M",
        "quantization_level": "Q8_0",
    }
    mtime = (store.manifests_dir / "registry.ollama.ai/library/smollm2/135m").stat().st_mtime
    assert model.modified_at.timestamp() == pytest.approx(mtime)
    assert model.modified_at.tzinfo is not None
    assert [m.short_name for m in store.list()] == ["smollm2:135m"]


def test_manifest_round_trips_byte_for_byte(store: ModelStore, gguf_path: Path) -> None:
    manifest_bytes = write_ollama_model(store.root, gguf_path)
    assert Manifest.parse(manifest_bytes).to_bytes() == manifest_bytes


def test_old_prompt_media_type_is_the_template(store: ModelStore, gguf_path: Path) -> None:
    write_ollama_model(store.root, gguf_path)
    path = store.manifests_dir / "registry.ollama.ai/library/smollm2/135m"
    path.write_bytes(path.read_bytes().replace(b"image.template", b"image.prompt"))
    assert store.resolve("smollm2:135m").template == TEMPLATE


def test_lookup_ignores_case_and_keeps_stored_case(store: ModelStore, gguf_path: Path) -> None:
    write_ollama_model(store.root, gguf_path, model="SmolLM2")
    model = store.resolve("smollm2:135M")
    assert model.name.model == "SmolLM2"
    assert model.short_name == "SmolLM2:135m"


@pytest.mark.parametrize("name", ["missing", "smollm2", "smollm2:other", "ns/smollm2:135m"])
def test_missing_model(store: ModelStore, gguf_path: Path, name: str) -> None:
    write_ollama_model(store.root, gguf_path)
    with pytest.raises(ModelNotFoundError, match=f'model "{name}" not found, try pulling it first'):
        store.resolve(name)


def test_missing_weights_blob_makes_the_model_incomplete(
    store: ModelStore, gguf_path: Path
) -> None:
    write_ollama_model(store.root, gguf_path)
    store.blob_path(sha(gguf_path.read_bytes())).unlink()
    with pytest.raises(ModelNotFoundError, match="incomplete"):
        store.resolve("smollm2:135m")
    assert [m.short_name for m in store.list()] == ["smollm2:135m"]  # listing does not stat


def test_list_skips_corrupt_manifests_and_sorts_newest_first(
    store: ModelStore, gguf_path: Path
) -> None:
    write_ollama_model(store.root, gguf_path, tag="old")
    write_ollama_model(store.root, gguf_path, tag="new")
    base = store.manifests_dir / "registry.ollama.ai/library/smollm2"
    os.utime(base / "old", (1_000_000, 1_000_000))
    bad = store.manifests_dir / "registry.ollama.ai/library/broken/latest"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"layers":[{"mediaType":"x","digest":"sha256:../../etc/passwd","size":1}]}')
    assert [m.short_name for m in store.list()] == ["smollm2:new", "smollm2:old"]
    with pytest.raises(StoreError, match="bad digest"):
        store.resolve("broken")


# -- blobs and digests -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "digest",
    [
        pytest.param("sha256:" + "a" * 63, id="short"),
        pytest.param("sha256:" + "a" * 65, id="long"),
        pytest.param("sha256:" + "g" * 64, id="not-hex"),
        pytest.param("sha512:" + "a" * 64, id="other-algorithm"),
        pytest.param("sha256/" + "a" * 64, id="slash"),
        pytest.param("../sha256-" + "a" * 64, id="traversal"),
        pytest.param("sha256:" + "a" * 64 + "\n", id="trailing-newline"),
        pytest.param("a" * 64, id="bare-hex"),
        pytest.param("", id="empty"),
    ],
)
def test_bad_digests_are_refused(store: ModelStore, digest: str) -> None:
    with pytest.raises(InvalidRequestError, match="invalid digest format"):
        store.blob_path(digest)
    with pytest.raises(InvalidRequestError):
        store.has_blob(digest)


def test_digest_forms_are_equivalent(store: ModelStore) -> None:
    hexa = "AB" * 32
    assert parse_digest(f"sha256-{hexa}") == f"sha256:{hexa.lower()}"
    assert store.blob_path(f"sha256:{hexa}") == store.blobs_dir / f"sha256-{hexa.lower()}"


def test_write_blob_verifies_the_digest(store: ModelStore) -> None:
    data = b"hello blob"
    wrong = sha(b"something else")
    with pytest.raises(InvalidRequestError, match="digest mismatch"):
        store.write_blob(wrong, [data[:5], data[5:]])
    assert blob_names(store) == set()  # the temporary file is gone too
    assert store.write_blob(sha(data), [data[:5], data[5:]]) is True
    assert store.blob_path(sha(data)).read_bytes() == data
    assert store.write_blob(sha(data), [b"not read"]) is False
    assert store.has_blob(sha(data).replace(":", "-"))


def test_blob_writer_keeps_zero_runs_as_holes(store: ModelStore) -> None:
    payload = [b"head", bytes(4 << 20), b"middle", bytes(4 << 20)]
    expected = sha(b"".join(payload))
    with store.blob_writer(expected) as writer:
        for chunk in payload:
            writer.write(chunk)
        writer.commit()
    path = store.blob_path(expected)
    assert path.stat().st_size == sum(map(len, payload))
    assert sha(path.read_bytes()) == expected
    assert path.stat().st_blocks * 512 < (1 << 20)


def test_abandoned_writer_leaves_nothing(store: ModelStore) -> None:
    with store.blob_writer() as writer:
        writer.write(b"partial")
    assert blob_names(store) == set()


# -- create ----------------------------------------------------------------------------------


def test_create_from_gguf_file(store: ModelStore, gguf_path: Path) -> None:
    digest = upload(store, gguf_path)
    progress = list(
        create_model(
            store,
            "tiny",
            files={"tiny.gguf": digest},
            template=TEMPLATE,
            system="Be brief.",
            parameters={"temperature": 0.5, "stop": ["<|end|>"], "num_ctx": 4096.0},
            license="MIT",
        )
    )
    model = store.resolve("tiny")
    layers = model.manifest.layers
    assert [layer.media_type.rsplit(".", 1)[1] for layer in layers] == [
        "model", "template", "system", "license", "params",
    ]  # fmt: skip
    assert statuses(progress) == [
        "parsing GGUF",
        f"using existing layer {digest}",
        f"creating new layer {layers[1].digest}",
        f"creating new layer {layers[2].digest}",
        f"creating new layer {layers[3].digest}",
        f"creating new layer {layers[4].digest}",
        "writing manifest",
        "success",
    ]
    assert model.model_path == store.blob_path(digest)
    assert (model.template, model.system, model.license) == (TEMPLATE, "Be brief.", ("MIT",))
    assert model.params == {"num_ctx": 4096, "stop": ["<|end|>"], "temperature": 0.5}
    # Go's encoder: sorted keys, HTML-escaped, integral floats as integers.
    params_blob = store.blob_path(layers[4].digest).read_bytes()
    assert params_blob == b'{"num_ctx":4096,"stop":["\\u003c|end|\\u003e"],"temperature":0.5}\n'
    assert model.details.family == "llama"
    assert model.details.families == ("llama",)
    assert model.details.format == "gguf"
    assert model.details.parameter_size == "121K"  # 120,640 parameters
    assert model.details.quantization_level == "F32"
    config = json.loads(store.blob_path(model.manifest.config.digest).read_bytes())  # type: ignore[union-attr]
    assert list(config) == [
        "model_format", "model_family", "model_families", "model_type", "file_type",
        "architecture", "os", "rootfs",
    ]  # fmt: skip
    assert config["rootfs"]["diff_ids"] == [layer.digest for layer in layers]


def test_create_again_reuses_every_layer(store: ModelStore, gguf_path: Path) -> None:
    digest = upload(store, gguf_path)
    list(create_model(store, "tiny", files={"t.gguf": digest}, system="S"))
    first = store.resolve("tiny")
    again = statuses(create_model(store, "tiny", files={"t.gguf": digest}, system="S"))
    assert not any(s.startswith("creating new layer") for s in again)
    assert store.resolve("tiny").digest == first.digest


def test_create_from_existing_model_overrides_and_merges(
    store: ModelStore, gguf_path: Path
) -> None:
    write_ollama_model(store.root, gguf_path)
    progress = statuses(
        create_model(
            store,
            "mine:v1",
            from_model="smollm2:135m",
            system="Talk like a pirate.",
            parameters={"temperature": 0.9},
            license="extra",
        )
    )
    base = store.resolve("smollm2:135m")
    model = store.resolve("mine:v1")
    assert progress[0] == f"using existing layer {base.manifest.layers[0].digest}"
    assert progress[-2:] == ["writing manifest", "success"]
    assert model.model_path == base.model_path
    assert model.details.parent_model == "smollm2:135m"
    assert model.details.parameter_size == "121K"  # from the GGUF, not the parent config
    assert model.template == base.template
    assert model.system == "Talk like a pirate."
    assert model.params == {"stop": ["<|im_end|>"], "temperature": 0.9}
    assert model.license == ("Apache License 2.0", "extra")
    assert model.messages == base.messages
    layers = model.manifest.layers
    assert [layer.media_type.rsplit(".", 1)[1] for layer in layers] == [
        "model", "template", "license", "messages", "system", "license", "params",
    ]  # fmt: skip
    assert [layer.from_ for layer in layers] == ["smollm2:135m"] * 4 + [""] * 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "neither 'from' or 'files' was specified"),
        ({"files": {"a.gguf": "sha256:" + "0" * 64}}, "not found"),
        ({"files": {"a.gguf": "sha256:nothex"}}, "invalid digest format"),
        ({"files": {"a.safetensors": "sha256:" + "0" * 64}}, "not found"),
        ({"files": {"a.txt": "sha256:" + "0" * 64}}, "unknown type"),
        ({"from_model": "base", "quantize": "q6_K"}, "supported types are F32, F16, BF16, Q8_0"),
        ({"from_model": "../x"}, "invalid model name"),
        ({"from_model": "base", "license": [1]}, "license"),
        ({"from_model": "base", "messages": [{"content": "x"}]}, "messages"),
    ],
)
def test_create_rejects_bad_requests(
    store: ModelStore, gguf_path: Path, kwargs: dict[str, object], message: str
) -> None:
    list(create_model(store, "base", files={"b.gguf": upload(store, gguf_path)}))
    with pytest.raises(InvalidRequestError, match=message):
        create_model(store, "new", **kwargs)  # type: ignore[arg-type]
    assert not store.exists("new")


def test_create_from_missing_model(store: ModelStore) -> None:
    with pytest.raises(ModelNotFoundError, match='model "ghost" not found'):
        create_model(store, "new", from_model="ghost")


def test_create_refuses_a_file_that_is_not_gguf(store: ModelStore) -> None:
    digest = sha(b"not a gguf at all")
    store.write_blob(digest, [b"not a gguf at all"])
    with pytest.raises(InvalidRequestError, match="supplied file was not in GGUF format"):
        list(create_model(store, "x", files={"x.gguf": digest}))
    assert not store.exists("x")


def test_create_refuses_a_gguf_with_duplicate_tokens(
    store: ModelStore, tiny_gguf: TinyGGUF
) -> None:
    digest = upload(store, tiny_gguf(corrupt="duplicate_tokens"))
    with pytest.raises(InvalidRequestError, match=r"invalid model file: duplicate token '.*' in"):
        list(create_model(store, "x", files={"x.gguf": digest}))
    assert not store.exists("x")
    assert blob_names(store) == {digest.replace(":", "-")}  # the upload stays, as Ollama's


def test_replacing_a_model_drops_its_unshared_blobs(store: ModelStore, gguf_path: Path) -> None:
    digest = upload(store, gguf_path)
    list(create_model(store, "tiny", files={"t.gguf": digest}, system="first"))
    old_system = store.resolve("tiny").manifest.layers[1].digest
    list(create_model(store, "tiny", files={"t.gguf": digest}, system="second"))
    assert not store.has_blob(old_system)
    assert store.has_blob(digest)


def test_replacing_with_noprune_keeps_old_blobs(tmp_path: Path, gguf_path: Path) -> None:
    store = ModelStore(tmp_path / "models", noprune=True)
    digest = upload(store, gguf_path)
    list(create_model(store, "tiny", files={"t.gguf": digest}, system="first"))
    old_system = store.resolve("tiny").manifest.layers[1].digest
    list(create_model(store, "tiny", files={"t.gguf": digest}, system="second"))
    assert store.has_blob(old_system)
    assert store.prune().blobs_removed == 0


def test_import_gguf_copies_sparsely_and_creates(store: ModelStore, tiny_gguf: TinyGGUF) -> None:
    source = tiny_gguf(sparse=True, embd=512, layers=4)
    progress = list(import_gguf(store, "sparse:1", source, system="hi"))
    assert progress[0] == {"status": "copying file", "total": source.stat().st_size, "completed": 0}
    assert progress[-1] == {"status": "success"}
    model = store.resolve("sparse:1")
    assert model.model_path is not None
    assert sha(model.model_path.read_bytes()) == sha(source.read_bytes())
    blocks = model.model_path.stat().st_blocks * 512
    assert blocks < source.stat().st_size // 4  # the holes stayed holes


def test_import_refuses_non_gguf(store: ModelStore, tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"\x00" * 100)
    with pytest.raises(GGUFError):
        import_gguf(store, "bogus", bogus)
    assert blob_names(store) == set()


# -- copy, delete, prune ---------------------------------------------------------------------


def test_copy_shares_the_manifest_bytes(store: ModelStore, gguf_path: Path) -> None:
    write_ollama_model(store.root, gguf_path)
    store.copy("smollm2:135m", "other/name:tag")
    src, dst = store.resolve("smollm2:135m"), store.resolve("other/name:tag")
    assert dst.digest == src.digest
    assert dst.short_name == "other/name:tag"
    with pytest.raises(ModelNotFoundError):
        store.copy("missing", "x")
    with pytest.raises(InvalidRequestError, match=r'destination "\.\./x" is invalid'):
        store.copy("smollm2:135m", "../x")


def test_copy_onto_a_case_variant_overwrites_it(store: ModelStore, gguf_path: Path) -> None:
    write_ollama_model(store.root, gguf_path, model="Smol")
    write_ollama_model(store.root, gguf_path, model="other")
    target = store.copy("other:135m", "SMOL:135M")
    assert target.parts[2:] == ("Smol", "135m")
    library = store.manifests_dir / "registry.ollama.ai/library"
    assert sorted(p.name for p in library.iterdir()) == ["Smol", "other"]


def test_delete_keeps_shared_blobs_until_the_last_user(store: ModelStore, gguf_path: Path) -> None:
    digest = upload(store, gguf_path)
    list(create_model(store, "a", files={"t.gguf": digest}, system="only a"))
    list(create_model(store, "ns/b:x", files={"t.gguf": digest}))
    only_a = store.resolve("a").manifest.layers[1].digest
    store.delete("a")
    assert not store.exists("a")
    assert not store.has_blob(only_a)
    assert store.has_blob(digest)
    assert (store.manifests_dir / "registry.ollama.ai" / "library").exists() is False
    store.delete("NS/B:X")
    assert blob_names(store) == set()
    assert list(store.manifests_dir.iterdir()) == []
    with pytest.raises(ModelNotFoundError, match="model 'a' not found"):
        store.delete("a")


def test_prune(store: ModelStore, gguf_path: Path) -> None:
    write_ollama_model(store.root, gguf_path)
    kept = blob_names(store)
    orphan = put_blob(store.root, b"orphan")
    pinned = put_blob(store.root, b"pinned")
    (store.blobs_dir / f"{sha(b'x').replace(':', '-')}-partial").write_bytes(b"x")
    (store.blobs_dir / ".tmp-sha256-stale").write_bytes(b"x")
    with store.pinned([pinned]), store.blob_writer() as live:
        live.write(b"in progress")
        result = store.prune()
        assert live._tmp.exists()
    assert result.blobs_removed == 1
    assert result.bytes_removed == len(b"orphan")
    assert result.temp_files_removed == 2
    assert blob_names(store) == kept | {pinned.replace(":", "-")}
    assert not store.has_blob(orphan)
    store.resolve("smollm2:135m")


def test_prune_on_a_read_only_store_removes_nothing_and_goes_on(
    store: ModelStore, gguf_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_ollama_model(store.root, gguf_path)
    put_blob(store.root, b"orphan")
    (store.blobs_dir / f"{sha(b'x').replace(':', '-')}-partial-0").write_bytes(b"x")
    temp = store.manifests_dir / ".tmp-stale"
    temp.write_bytes(b"x")
    before = blob_names(store)
    with read_only(store.root, monkeypatch):
        assert store.prune() == PruneResult()
        assert blob_names(store) == before
        assert temp.exists()
        assert store.resolve("smollm2:135m").model_path is not None


def test_prune_keeps_everything_when_a_manifest_is_unreadable(
    store: ModelStore, gguf_path: Path
) -> None:
    write_ollama_model(store.root, gguf_path)
    put_blob(store.root, b"orphan")
    bad = store.manifests_dir / "registry.ollama.ai/library/bad/latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    before = blob_names(store)
    assert store.prune().blobs_removed == 0
    assert blob_names(store) == before


def test_noprune(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, noprune=True)
    put_blob(tmp_path, b"orphan")
    assert store.prune().blobs_removed == 0
    assert store.has_blob(sha(b"orphan"))


# -- nothing resolves outside the store ------------------------------------------------------


def test_manifest_symlink_leaving_the_store_is_refused(
    store: ModelStore, gguf_path: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    write_ollama_model(outside, gguf_path)
    link = store.manifests_dir / "registry.ollama.ai/library/evil/latest"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside / "manifests/registry.ollama.ai/library/smollm2/135m")
    with pytest.raises(StoreError, match="outside the model store"):
        store.resolve("evil")
    assert store.list() == []


def test_blob_symlink_leaving_the_store_is_refused(store: ModelStore, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"secret")
    digest = sha(b"secret")
    (store.blobs_dir / digest.replace(":", "-")).symlink_to(secret)
    with pytest.raises(StoreError, match="outside the model store"):
        store.has_blob(digest)
    assert store.prune().blobs_removed == 1  # the dangling link goes, its target stays
    assert blob_names(store) == set()
    assert secret.read_bytes() == b"secret"


def test_directory_symlink_leaving_the_store_is_refused(
    store: ModelStore, gguf_path: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    write_ollama_model(outside, gguf_path)
    (store.manifests_dir / "evil.example").symlink_to(outside / "manifests/registry.ollama.ai")
    with pytest.raises(StoreError):
        store.resolve("evil.example/library/smollm2:135m")


def test_symlinks_inside_the_store_are_fine(store: ModelStore, gguf_path: Path) -> None:
    write_ollama_model(store.root, gguf_path)
    alias = store.manifests_dir / "registry.ollama.ai/library/alias/latest"
    alias.parent.mkdir(parents=True)
    alias.symlink_to(store.manifests_dir / "registry.ollama.ai/library/smollm2/135m")
    assert store.resolve("alias").digest == store.resolve("smollm2:135m").digest


def test_store_under_a_symlinked_root(tmp_path: Path, gguf_path: Path) -> None:
    real = tmp_path / "disk" / "models"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    write_ollama_model(real, gguf_path)
    assert ModelStore(tmp_path / "link").resolve("smollm2:135m").model_path is not None


def test_write_manifest_needs_every_blob(store: ModelStore) -> None:
    data = (
        f'{{"schemaVersion":2,"mediaType":"{MANIFEST_TYPE}","config":{{"mediaType":"{CONFIG_TYPE}",'
        f'"digest":"{sha(b"{}")}","size":2}},"layers":[]}}\n'
    ).encode()
    with pytest.raises(StoreError, match="missing"):
        store.write_manifest("x", data)
    put_blob(store.root, b"{}")
    assert store.write_manifest("x", data) == hashlib.sha256(data).hexdigest()
    assert store.resolve("x").model_path is None


# -- concurrency: the way the server calls it -------------------------------------------------


async def test_concurrent_creates_deletes_and_prunes(store: ModelStore, gguf_path: Path) -> None:
    digest = upload(store, gguf_path)
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        try:
            for round_ in range(4):
                list(create_model(store, f"m{i}", files={"t.gguf": digest}, system=f"{i}-{round_}"))
                store.prune()
            if i % 2:
                store.delete(f"m{i}")
        except BaseException as exc:  # collected and re-raised in the test body
            with lock:
                errors.append(exc)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(trio.to_thread.run_sync, work, i)
    assert errors == []
    assert sorted(m.short_name for m in store.list()) == ["m0:latest", "m2:latest", "m4:latest"]
    for model in store.list():
        store.resolve(model.name)  # every blob it needs is there
        assert model.system == f"{model.name.model[1:]}-3"
    assert store.prune().blobs_removed == 0


# -- formatting helpers ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (999, "999"),
        (120_640, "121K"),
        (134_515_008, "134.52M"),
        (135_000_000, "135M"),
        (1_235_814_400, "1.2B"),
        (8_030_261_248, "8.0B"),
        (7_000_000_000, "7B"),
    ],
)
def test_human_number(n: int, text: str) -> None:
    assert human_number(n) == text


def test_go_json_matches_go_encoder() -> None:
    assert go_json({"a": "<&>", "b": 1.0, "c": [0.5, 2.0]}) == (
        b'{"a":"\\u003c\\u0026\\u003e","b":1,"c":[0.5,2]}\n'
    )
    assert go_json({"é": "\u2028"}) == '{"é":"\\u2028"}\n'.encode()


@pytest.mark.slow
def test_import_real_smollm2(store: ModelStore, smollm2_path: Path) -> None:
    progress = list(import_gguf(store, "smollm2:135m", smollm2_path))
    assert progress[-1] == {"status": "success"}
    model = store.resolve("smollm2:135m")
    assert model.details.family == "llama"
    assert model.details.parameter_size == "134.52M"
    assert model.details.quantization_level == "Q4_1"
    assert model.manifest.layers[0].media_type == MEDIA_MODEL
