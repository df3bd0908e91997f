"""Pulling models from an Ollama registry (the OCI distribution protocol) into the store.

::

    GET {scheme}://{host}/v2/{namespace}/{model}/manifests/{tag}   the manifest
    GET {scheme}://{host}/v2/{namespace}/{model}/blobs/{digest}    each layer and the config

``https`` unless ``insecure`` (then ``http``, as Ollama does).  Progress is reported with
Ollama's statuses: "pulling manifest", "pulling <12 hex>" (``digest``, ``total``,
``completed``), "verifying sha256 digest", "writing manifest", "removing unused layers"
(when a pull replaced layers of an older version), "success".  A model already in the store
whose registry cannot be reached or does not know the name keeps its local copy: the pull
says so in one status line and ends in "success" (Ollama fails it; Codex calls
``/api/pull`` on every start, so this is what lets it start offline).  The manifest is written only
after every blob is in place and verified, so an interrupted or corrupt download never
leaves a broken model; what was downloaded stays as resumable partial files.

Two entry points share :func:`run_pull`:

* :func:`pull_progress`, an ``@trio.as_safe_channel`` generator for the CLI and tests;
* :func:`start_pull`, which runs the pull as a task in a long-lived nursery (the app's) and
  returns a bounded receive channel, for HTTP handlers whose body generators must not hold
  nurseries.  Closing that channel (the client went away) stops the pull.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import AsyncGenerator

import httpx
import trio

from .._version import __version__
from ..errors import ModelNotFoundError
from .download import (
    BlobDownload,
    DownloadOptions,
    PullError,
    progress_event,
    status_error,
)
from .manifest import MANIFEST_MEDIA_TYPE, Layer, Manifest, StoreError
from .names import ModelName, parse_name
from .registry_auth import RegistryAuth
from .store import ModelStore, PinSet
from .transfer import Event, report_failure, report_until, single_error, unique_layers

__all__ = [
    "DownloadOptions",
    "ManifestUnavailable",
    "PullError",
    "fetch_manifest",
    "open_registry_client",
    "pull_progress",
    "registry_url",
    "run_pull",
    "start_pull",
]

log = logging.getLogger("ollamatrio.store.registry")

USER_AGENT = f"ollamatrio/{__version__}"
MANIFEST_LIMIT = 4 << 20  # real manifests are a few KB

# Downloads in progress, per store: a second pull of the same blob follows the first one's
# progress and takes over if it stops, instead of writing the same partial file.
_active: weakref.WeakKeyDictionary[ModelStore, dict[str, BlobDownload]] = (
    weakref.WeakKeyDictionary()
)


def registry_url(name: ModelName, *, insecure: bool = False) -> str:
    """Base URL of the repository ``name`` lives in: ``https://host/v2/namespace/model``."""
    scheme = "http" if insecure else "https"
    return f"{scheme}://{name.host}/v2/{name.namespace}/{name.model}"


def open_registry_client(*, transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """An ``AsyncClient`` for registries: no read timeout (stalls are detected per part),
    and the registry's token handshake answered (:mod:`.registry_auth`)."""
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(None, connect=30.0),
        follow_redirects=True,
        headers={"User-Agent": USER_AGENT},
        auth=RegistryAuth(),
    )


class ManifestUnavailable(PullError):
    """The registry could not be reached, or does not know the name (404): a model already
    in the store may be kept as it is."""


async def fetch_manifest(
    client: httpx.AsyncClient, name: ModelName, *, insecure: bool = False
) -> tuple[bytes, Manifest]:
    """The manifest bytes as served, and their parsed, validated form."""
    url = f"{registry_url(name, insecure=insecure)}/manifests/{name.tag}"
    data = bytearray()
    try:
        headers = {"Accept": MANIFEST_MEDIA_TYPE}
        async with client.stream("GET", url, headers=headers, follow_redirects=True) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                error = ManifestUnavailable if resp.status_code == 404 else PullError
                raise error(status_error("pull model manifest", resp))
            async for chunk in resp.aiter_bytes():
                data += chunk
                if len(data) > MANIFEST_LIMIT:
                    raise PullError("pull model manifest: manifest is too large")
    except httpx.TransportError as exc:
        raise ManifestUnavailable(f"pull model manifest: {exc or type(exc).__name__}") from None
    try:
        manifest = Manifest.parse(bytes(data))
    except StoreError as exc:
        raise PullError(f"pull model manifest: {exc}") from None
    return bytes(data), manifest


@trio.as_safe_channel
async def pull_progress(
    store: ModelStore,
    name: str | ModelName,
    *,
    insecure: bool = False,
    client: httpx.AsyncClient | None = None,
    options: DownloadOptions | None = None,
) -> AsyncGenerator[Event, None]:
    """Pull ``name`` into ``store``, yielding Ollama's progress dicts; raises on failure.

    Use it as ``async with pull_progress(store, "llama3") as events: async for e in events``.
    Leaving the block early cancels the pull (its partial files stay, to be resumed).
    """
    model = parse_name(name)
    send, recv = trio.open_memory_channel[Event](0)
    with single_error(PullError):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_run_closing, send, store, model, insecure, client, options)
            with recv:
                async for event in recv:
                    yield event


def start_pull(
    nursery: trio.Nursery,
    store: ModelStore,
    name: str | ModelName,
    *,
    insecure: bool = False,
    client: httpx.AsyncClient | None = None,
    options: DownloadOptions | None = None,
    buffer: int = 16,
) -> trio.MemoryReceiveChannel[Event]:
    """Run a pull as a task in ``nursery``; progress dicts arrive on the returned channel.

    A failure arrives as a last ``{"error": message}`` dict (Ollama's stream shape); the
    channel closes when the pull ends.  Close the channel to stop the pull: its next
    progress update meets ``BrokenResourceError`` and the task cancels its downloads.
    An invalid name raises here, before anything starts.
    """
    model = parse_name(name)
    send, recv = trio.open_memory_channel[Event](buffer)
    nursery.start_soon(_pull_task, send, store, model, insecure, client, options)
    return recv


async def _run_closing(
    send: trio.MemorySendChannel[Event],
    store: ModelStore,
    model: ModelName,
    insecure: bool,
    client: httpx.AsyncClient | None,
    options: DownloadOptions | None,
) -> None:
    with send:
        await run_pull(store, model, send, insecure=insecure, client=client, options=options)


async def _pull_task(
    send: trio.MemorySendChannel[Event],
    store: ModelStore,
    model: ModelName,
    insecure: bool,
    client: httpx.AsyncClient | None,
    options: DownloadOptions | None,
) -> None:
    async def pull() -> None:
        await run_pull(store, model, send, insecure=insecure, client=client, options=options)

    await report_failure(send, "pull", model, pull)


async def run_pull(
    store: ModelStore,
    name: str | ModelName,
    send: trio.MemorySendChannel[Event],
    *,
    insecure: bool = False,
    client: httpx.AsyncClient | None = None,
    options: DownloadOptions | None = None,
) -> None:
    """The pull itself: progress dicts go to ``send`` (which it does not close)."""
    model = parse_name(name)
    options = options or DownloadOptions()
    old_digests = await trio.to_thread.run_sync(_existing_digests, store, model)
    async with contextlib.AsyncExitStack() as stack:
        if client is None:
            client = await stack.enter_async_context(open_registry_client())
        await send.send({"status": "pulling manifest"})
        try:
            raw, manifest = await fetch_manifest(client, model, insecure=insecure)
        except ManifestUnavailable as exc:
            if not old_digests:
                raise
            log.info("pull of %s: %s; the local copy stays", model.display_shortest, exc)
            await send.send({"status": f"{exc}; using the local copy"})
            await send.send({"status": "success"})
            return
        blobs_url = f"{registry_url(model, insecure=insecure)}/blobs"
        owned: list[BlobDownload] = []
        with store.pinned() as pins:
            try:
                for layer in unique_layers(manifest.all_layers()):
                    url = f"{blobs_url}/{layer.digest}"
                    download = await _pull_blob(store, layer, url, client, pins, send, options)
                    if download is not None:
                        owned.append(download)
                await send.send({"status": "verifying sha256 digest"})
                for download in owned:
                    await download.verify_and_install(pins)
            finally:
                active = _active.get(store, {})
                for download in owned:
                    active.pop(download.digest, None)
                    download.release()
            await send.send({"status": "writing manifest"})
            await trio.to_thread.run_sync(store.write_manifest, model, raw)
        unused = old_digests - manifest.digests()
        if unused and not store.noprune:
            await send.send({"status": "removing unused layers"})
            # Blobs of the replaced version that no manifest uses any more (Ollama's
            # deleteUnusedLayers).
            await trio.to_thread.run_sync(store.remove_unreferenced, unused)
        await send.send({"status": "success"})


async def _pull_blob(
    store: ModelStore,
    layer: Layer,
    url: str,
    client: httpx.AsyncClient,
    pins: PinSet,
    send: trio.MemorySendChannel[Event],
    options: DownloadOptions,
) -> BlobDownload | None:
    """Download one blob into its partial file; None if it was already in the store."""
    active = _active.setdefault(store, {})
    while True:
        if await trio.to_thread.run_sync(store.pin_if_present, layer.digest, pins):
            await send.send(progress_event(layer.digest, layer.size, layer.size))
            return None
        other = active.get(layer.digest)
        if other is None:
            break
        await report_until(other, send, _released, options.heartbeat)
        # The other pull is done with it: present now, or ours to take over.

    download = BlobDownload(store, layer.digest, layer.size, options)
    active[layer.digest] = download  # claimed with no checkpoint since the check above
    try:
        await trio.to_thread.run_sync(download.prepare)
        with single_error(PullError):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(download.run, client, url)
                await report_until(download, send, _finished, options.heartbeat)
    except BaseException:
        active.pop(layer.digest, None)
        download.release()
        raise
    return download


def _released(download: BlobDownload) -> bool:
    return download.released.is_set()


def _finished(download: BlobDownload) -> bool:
    return download.finished


def _existing_digests(store: ModelStore, model: ModelName) -> set[str]:
    try:
        return store.read_manifest(model).digests()
    except ModelNotFoundError:
        return set()
    except (StoreError, OSError) as exc:
        log.warning("pulling %s over an unreadable manifest: %s", model, exc)
        return set()
