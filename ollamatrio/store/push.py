"""Pushing a model from the store to a registry (the OCI distribution protocol).

Each blob the model's manifest names, its layers then its config (Ollama's order), is sent
with a resumable chunked upload (:mod:`.upload`) unless a ``HEAD`` finds the registry has
it already; the manifest goes last, as stored (so its digest is the local one), with a
``PUT`` to ``/v2/<namespace>/<model>/manifests/<tag>``: a push cut short never publishes a
model whose blobs are missing.  ``https`` unless ``insecure``.  Progress is reported with
Ollama's statuses: "retrieving manifest", "pushing <12 hex>" (``digest``, ``total``,
``completed``), "pushing manifest", "success".  Nothing in the store changes: the blobs are
pinned while they are read, so no delete or prune takes one mid-upload.

An upload a push leaves unfinished (stopped, or failed after its retries) is remembered per
store, registry repository and digest for as long as the server runs, and the next push of
that blob there asks the registry where it stands and sends the rest.

Two entry points share :func:`run_push`, as a pull's do (:mod:`.registry`):
:func:`push_progress` (an ``@trio.as_safe_channel`` generator) and :func:`start_push` (a
task in a long-lived nursery reporting on a bounded channel; closing it stops the push).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import AsyncGenerator

import httpx
import trio

from ..errors import ModelNotFoundError
from .manifest import MANIFEST_MEDIA_TYPE, Layer, Manifest
from .names import ModelName, parse_name
from .registry import open_registry_client, registry_url
from .store import ModelStore
from .transfer import Event, report_failure, report_until, single_error, unique_layers
from .upload import BlobUpload, PushError, UploadOptions, registry_request, retrying

__all__ = ["PushError", "UploadOptions", "push_progress", "run_push", "start_push"]

log = logging.getLogger("ollamatrio.store.push")

# Unfinished uploads, per store: (repository URL, digest) -> the upload's URL.
_unfinished: weakref.WeakKeyDictionary[ModelStore, dict[tuple[str, str], str]] = (
    weakref.WeakKeyDictionary()
)


@trio.as_safe_channel
async def push_progress(
    store: ModelStore,
    name: str | ModelName,
    *,
    insecure: bool = False,
    client: httpx.AsyncClient | None = None,
    options: UploadOptions | None = None,
) -> AsyncGenerator[Event, None]:
    """Push ``name`` from ``store``, yielding Ollama's progress dicts; raises on failure.
    Leaving the block early stops the push (its upload is resumed by the next one)."""
    model = parse_name(name)
    send, recv = trio.open_memory_channel[Event](0)
    with single_error(PushError):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_run_closing, send, store, model, insecure, client, options)
            with recv:
                async for event in recv:
                    yield event


def start_push(
    nursery: trio.Nursery,
    store: ModelStore,
    name: str | ModelName,
    *,
    insecure: bool = False,
    client: httpx.AsyncClient | None = None,
    options: UploadOptions | None = None,
    buffer: int = 16,
) -> trio.MemoryReceiveChannel[Event]:
    """Run a push as a task in ``nursery``; progress dicts arrive on the returned channel,
    a failure as a last ``{"error": message}`` dict.  Close the channel to stop the push.
    An invalid name raises here, before anything starts."""
    model = parse_name(name)
    send, recv = trio.open_memory_channel[Event](buffer)

    async def push() -> None:  # the name as given: an error names it so
        await run_push(store, name, send, insecure=insecure, client=client, options=options)

    nursery.start_soon(report_failure, send, "push", model, push)
    return recv


async def _run_closing(
    send: trio.MemorySendChannel[Event],
    store: ModelStore,
    model: ModelName,
    insecure: bool,
    client: httpx.AsyncClient | None,
    options: UploadOptions | None,
) -> None:
    with send:
        await run_push(store, model, send, insecure=insecure, client=client, options=options)


async def run_push(
    store: ModelStore,
    name: str | ModelName,
    send: trio.MemorySendChannel[Event],
    *,
    insecure: bool = False,
    client: httpx.AsyncClient | None = None,
    options: UploadOptions | None = None,
) -> None:
    """The push itself: progress dicts go to ``send`` (which it does not close)."""
    options = options or UploadOptions()
    await send.send({"status": "retrieving manifest"})
    try:
        model, raw, manifest = await trio.to_thread.run_sync(store.read_manifest_bytes, name)
    except ModelNotFoundError:
        await send.send({"status": "couldn't retrieve manifest"})
        raise
    repo_url = registry_url(model, insecure=insecure)
    async with contextlib.AsyncExitStack() as stack:
        if client is None:
            client = await stack.enter_async_context(open_registry_client())
        with store.pinned(manifest.digests()):
            for layer in _push_order(manifest):
                await _push_blob(store, layer, repo_url, client, send, options)
        await send.send({"status": "pushing manifest"})
        registry = client
        url = f"{repo_url}/manifests/{model.tag}"
        headers = {"Content-Type": MANIFEST_MEDIA_TYPE}

        async def put_manifest() -> httpx.Response:
            return await registry_request(
                registry, "PUT", url, "push manifest", ok=(200, 201), content=raw, headers=headers
            )

        await retrying(options, "push manifest", put_manifest)
    await send.send({"status": "success"})


def _push_order(manifest: Manifest) -> list[Layer]:
    """The layers, then the config (Ollama's order), each once."""
    config = [manifest.config] if manifest.config else []
    return list(unique_layers([*manifest.layers, *config]))


async def _push_blob(
    store: ModelStore,
    layer: Layer,
    repo_url: str,
    client: httpx.AsyncClient,
    send: trio.MemorySendChannel[Event],
    options: UploadOptions,
) -> None:
    path = store.blob_path(layer.digest)
    if not await trio.to_thread.run_sync(path.is_file):
        raise PushError(f"push {layer.digest[7:19]}: the blob is missing from the store")
    unfinished = _unfinished.setdefault(store, {})
    key = (repo_url, layer.digest)
    upload = BlobUpload(path, layer, repo_url, options, location=unfinished.pop(key, None))
    try:
        if await upload.in_registry(client):
            upload.skip()  # one line, complete (as Ollama reports a blob the registry has)
            await send.send(upload.progress())
            return
        with single_error(PushError):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(upload.run, client)
                await report_until(upload, send, _finished, options.heartbeat)
    finally:
        if upload.location is not None:  # stopped or failed mid-upload: for the next push
            unfinished[key] = upload.location


def _finished(upload: BlobUpload) -> bool:
    return upload.finished
