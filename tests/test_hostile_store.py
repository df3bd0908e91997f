"""The model store as a hostile client sees it, over raw sockets: concurrent create, copy
and delete of the same names leave no orphan blobs; error bodies name models and digests,
never the server's paths; a GGUF llama.cpp cannot load is refused at ``/api/create``."""

from __future__ import annotations

import errno
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio
from conftest import ServerFactory
from helpers.read_only import read_only

from ollamatrio.api.errors import message_for
from ollamatrio.errors import RunnerStartError
from ollamatrio.store import MEDIA_MODEL, Layer, Manifest
from ollamatrio.testing.store_race import http_request, run_race, store_audit

TinyGGUF = Callable[..., Path]


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


async def test_racing_create_copy_delete_leaves_no_orphans(api_server: ServerFactory) -> None:
    async with api_server() as srv:
        host, port = host_port(srv.url)
        result = await trio.to_thread.run_sync(
            lambda: run_race(host, port, "tiny", threads=8, operations=30, seed=1)
        )
        models_dir = Path(srv.store.root)
    assert result.server_errors == 0, result.errors
    assert sum(result.operations.values()) == 240
    assert set(result.statuses) <= {200, 404}
    audit = store_audit(models_dir)  # the server has stopped: nothing writes the store
    assert audit.missing == ()
    assert audit.orphans == ()


def answer_json(rest: bytes) -> Any:
    """The JSON body of an answer ``http_request`` read (``Connection: close``: it is whole)."""
    head, _, body = rest.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" not in head.lower()
    return json.loads(body)


def upload(host: str, port: int, path: Path) -> str:
    data = path.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    status, _ = http_request(host, port, "POST", f"/api/blobs/{digest}", data=data)
    assert status == 201
    return digest


async def test_create_refuses_a_gguf_with_duplicate_tokens(
    api_server: ServerFactory, tiny_gguf: TinyGGUF
) -> None:
    async with api_server() as srv:
        host, port = host_port(srv.url)

        def create() -> tuple[int, Any]:
            digest = upload(host, port, tiny_gguf(corrupt="duplicate_tokens"))
            body = {"model": "dup", "files": {"dup.gguf": digest}, "stream": False}
            status, rest = http_request(host, port, "POST", "/api/create", body)
            return status, answer_json(rest)

        status, answer = await trio.to_thread.run_sync(create)
        assert status == 400
        assert "duplicate token" in answer["error"]
        assert "llama.cpp cannot load it" in answer["error"]
        assert not srv.store.exists("dup")


async def test_a_stored_model_with_duplicate_tokens_fails_clearly_without_a_runner(
    api_server: ServerFactory, tiny_gguf: TinyGGUF
) -> None:
    async with api_server() as srv:
        # Stored by another server (or before the check at create): blob and manifest only.
        data = tiny_gguf(corrupt="duplicate_tokens").read_bytes()
        digest, _ = srv.store.write_bytes_blob(data)
        srv.store.write_manifest("dup", Manifest(None, (Layer(MEDIA_MODEL, digest, len(data)),)))
        host, port = host_port(srv.url)
        for path, body in (
            ("/api/generate", {"model": "dup", "prompt": "hi", "stream": False}),
            ("/api/chat", {"model": "dup", "messages": [{"role": "user", "content": "hi"}]}),
            ("/api/embed", {"model": "dup", "input": "hi"}),
            (
                "/v1/chat/completions",
                {"model": "dup", "messages": [{"role": "user", "content": "x"}]},
            ),
        ):
            status, rest = await trio.to_thread.run_sync(
                lambda p=path, b=body: http_request(host, port, "POST", p, b)
            )
            assert status == 500, path
            message = json.dumps(answer_json(rest))
            assert "cannot be loaded: duplicate token" in message, path
        assert srv.engines.loads == 0  # no runner was started for it


async def test_error_bodies_name_models_and_digests_not_paths(
    api_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"a blob for a read-only store"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    cases: list[tuple[str, str, Any, str]] = [
        ("POST", "/api/create", {"model": "x", "from": "tiny", "system": "s", "stream": False},
         'create "x:latest": write blob sha256:'),
        ("POST", "/api/copy", {"source": "tiny", "destination": "y"},
         'write manifest for "y:latest": '),
        ("DELETE", "/api/delete", {"model": "tiny"}, 'delete model "tiny:latest": '),
        ("POST", f"/api/blobs/{digest}", data, f"write blob {digest}: "),
    ]  # fmt: skip
    async with api_server() as srv:
        host, port = host_port(srv.url)
        root = str(srv.store.root)
        with read_only(srv.store.root, monkeypatch):
            for method, path, body, words in cases:
                kwargs = {"data": body} if isinstance(body, bytes) else {"body": body}
                status, rest = await trio.to_thread.run_sync(
                    lambda m=method, p=path, k=kwargs: http_request(host, port, m, p, **k)
                )
                message = answer_json(rest)["error"]
                assert status == 500, path
                assert message.startswith(words), message
                assert message.endswith(("read-only file system", "permission denied")), message
                assert root not in message
                assert "/" not in message.removeprefix(words)


def test_paths_into_the_store_are_cut_from_any_error_message() -> None:
    blob = "sha256-" + "ab" * 32
    load = RunnerStartError(f"llama_model_load: failed to open '/srv/models/blobs/{blob}': bad")
    assert message_for(load) == f"llama_model_load: failed to open '{blob}': bad"
    unexpected = OSError(errno.EROFS, "Read-only file system", "/srv/models/manifests/a/b/c/d")
    assert message_for(unexpected) == "read-only file system"
