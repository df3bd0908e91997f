"""One blob's resumable upload to a registry: the OCI distribution protocol's chunked upload.

::

    HEAD  {repo}/blobs/{digest}                   200: the registry has it, nothing is sent
    POST  {repo}/blobs/uploads/                   202, Location: where the upload goes
    PATCH {location}  Content-Range: a-b  <body>  202, Location: where the next chunk goes,
                                                  Range: 0-b (what the registry holds)
    GET   {location}                              204, Range: 0-n (resume after byte n)
    PUT   {location}?digest={digest}              201: complete, the registry checked it

Chunks go one after another (the protocol has none in parallel), each read from the blob's
file a block at a time, so memory stays at one block whatever the blob's size.  A chunk
cut short (the connection lost, a 5xx, a stall) is retried a bounded number of times with
a growing pause: the next attempt asks the registry how much it holds (``GET``, ``Range``)
and sends from there, so what it received is not sent again.  :attr:`BlobUpload.location`
outlives a push that stopped or failed (its owner keeps it), so the next push of the blob
to the same repository resumes the same way; a registry that no longer knows the upload
(404) gets a new one.  The progress event is Ollama's ``pushing <12 hex>`` line.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import trio

from ..errors import OllamatrioError
from .manifest import Layer

log = logging.getLogger("ollamatrio.store.upload")

_MB = 1000 * 1000  # Ollama's format.MegaByte
_RANGE_RE = re.compile(r"(?:bytes=)?0-(-?\d+)")
ANSWER_LIMIT = 512  # a registry's answers are headers and a short JSON error, if anything
T = TypeVar("T")


class PushError(OllamatrioError):
    """A push failed; the message is what Ollama would say where Ollama has a message."""


class _Retryable(Exception):
    """A failure worth another attempt (connection lost, 5xx, a stall, a lost upload)."""


@dataclass(frozen=True)
class UploadOptions:
    """How blobs are sent; the sizes are Ollama's smallest upload part."""

    chunk_size: int = 100 * _MB  # bytes per PATCH
    block_size: int = 1 << 20  # bytes read from the file (and counted) at a time
    max_retries: int = 6  # attempts in a row that end in a failure
    backoff_base: float = 1.0  # seconds before the 2nd attempt, doubling each time...
    backoff_max: float = 30.0  # ...up to this
    stall_timeout: float = 30.0  # a request that moves nothing for this long is retried
    heartbeat: float = 1.0  # progress is re-sent this often while nothing moves

    def backoff(self, failures: int) -> float:
        return min(self.backoff_base * 2.0 ** (failures - 1), self.backoff_max)


def progress_event(digest: str, total: int, completed: int) -> dict[str, Any]:
    """Ollama's per-blob push line; zero counts are left out as Go's omitempty does."""
    event: dict[str, Any] = {"status": f"pushing {digest[7:19]}", "digest": digest}
    if total:
        event["total"] = total
    if completed:
        event["completed"] = completed
    return event


def unauthorized(what: str, response: httpx.Response, body: str) -> PushError:
    """A 401 the registry client could not answer (no Bearer challenge, or the token did
    not do): Ollama's "unauthorized: access denied", and what the registry said."""
    challenge = response.headers.get("www-authenticate", "").split(" ", 1)[0]
    asks = f" (the registry asks for {challenge} credentials)" if challenge else ""
    return PushError(f"{what}: unauthorized: access denied{asks}: {body}".rstrip(": "))


async def registry_request(
    client: httpx.AsyncClient,
    method: str,
    url: str | httpx.URL,
    what: str,
    *,
    ok: tuple[int, ...],
    **kwargs: Any,
) -> httpx.Response:
    """One request whose answer matters by its status and headers: one of ``ok``, else a
    :class:`PushError` (401, other 4xx) or :class:`_Retryable` (5xx, 429, the network).
    Of the answer's body only the first ``ANSWER_LIMIT`` bytes are read (for a message)."""
    body = bytearray()
    try:
        async with client.stream(method, url, **kwargs) as response:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) >= ANSWER_LIMIT:
                    break
    except httpx.TransportError as exc:
        raise _Retryable(f"{what}: {exc or type(exc).__name__}") from None
    status = response.status_code
    if status in ok:
        return response
    text = body[:ANSWER_LIMIT].decode(errors="replace").strip()
    if status == 401:
        raise unauthorized(what, response, text)
    # Ollama's words (as a pull's): 404 is "file does not exist", else "<code>: <body>".
    message = f"{what}: file does not exist" if status == 404 else f"{what}: {status}: {text}"
    if status == 429 or status >= 500:
        raise _Retryable(message)
    raise PushError(message)


async def retrying(options: UploadOptions, what: str, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, again after a network failure or a 5xx (as a chunk is retried)."""
    failures = 0
    while True:
        try:
            return await call()
        except _Retryable as exc:
            failures += 1
            if failures >= options.max_retries:
                raise PushError(f"max retries exceeded: {exc}") from None
            log.info("%s attempt %d failed: %s", what, failures, exc)
            await trio.sleep(options.backoff(failures))


class _Chunk:
    """A chunk's body, read from the blob's file a block at a time.  Iterating it again
    starts over (the token handshake sends a request twice).  Plain iterators, not async
    generators: one left unfinished by a cut connection needs no finalizing."""

    def __init__(self, upload: BlobUpload, fd: int, start: int, stop: int) -> None:
        self.upload, self.fd, self.start, self.stop = upload, fd, start, stop

    def __aiter__(self) -> _ChunkReader:
        return _ChunkReader(self, self.start)


class _ChunkReader:
    def __init__(self, chunk: _Chunk, offset: int) -> None:
        self.chunk, self.offset = chunk, offset

    def __aiter__(self) -> _ChunkReader:
        return self

    async def __anext__(self) -> bytes:
        chunk, upload = self.chunk, self.chunk.upload
        if self.offset >= chunk.stop:
            raise StopAsyncIteration
        size = min(upload.options.block_size, chunk.stop - self.offset)
        block: bytes = await trio.to_thread.run_sync(os.pread, chunk.fd, size, self.offset)
        if not block:
            raise PushError(f"push {upload.digest[7:19]}: the blob file is shorter than its size")
        self.offset += len(block)
        upload.sent(self.offset)
        return block


class BlobUpload:
    """Upload the blob at ``path`` (``layer``) to the repository at ``repo_url``.

    ``location``: an upload this one resumes (from an earlier push), then the upload in
    progress; None once the blob is in the registry.  Every change of progress sets the
    current :attr:`changed` event (and swaps in a new one).
    """

    def __init__(
        self,
        path: Path,
        layer: Layer,
        repo_url: str,
        options: UploadOptions,
        location: str | None = None,
    ) -> None:
        self.path = path
        self.digest = layer.digest
        self.total = layer.size
        self.repo_url = repo_url
        self.options = options
        self.location = location
        self.completed = 0
        self.finished = False
        self._changed = trio.Event()
        self._stall: trio.CancelScope | None = None

    # -- progress ------------------------------------------------------------------------

    def progress(self) -> dict[str, Any]:
        return progress_event(self.digest, self.total, self.completed)

    @property
    def changed(self) -> trio.Event:
        """Set at the next change of progress or state (take it before awaiting anything)."""
        return self._changed

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def sent(self, offset: int) -> None:
        """The chunk being sent has reached ``offset``: progress, and not stalled."""
        self.completed = offset
        if self._stall is not None:
            self._stall.relative_deadline = self.options.stall_timeout
        self._notify()

    # -- the protocol --------------------------------------------------------------------

    async def in_registry(self, client: httpx.AsyncClient) -> bool:
        """Whether the registry has the blob already (``HEAD``; retried as a chunk is)."""
        url = f"{self.repo_url}/blobs/{self.digest}"
        what = f"push {self.digest[7:19]}"

        async def head() -> httpx.Response:
            return await registry_request(client, "HEAD", url, what, ok=(200, 404))

        return (await retrying(self.options, what, head)).status_code == 200

    def skip(self) -> None:
        """The registry has the blob (found there, or sent): nothing more to send."""
        self.location = None
        self.completed = self.total
        self.finished = True
        self._notify()

    async def run(self, client: httpx.AsyncClient) -> None:
        """Send the blob; returns once the registry has it."""
        failures = 0
        offset: int | None = None
        while True:
            try:
                if offset is None:
                    offset = await self._resume(client)
                    self.sent(offset)
                if offset < self.total:
                    offset = await self._send_chunk(client, offset)
                    failures = 0  # a chunk went through: the link works
                    continue
                await self._complete(client)
                break
            except _Retryable as exc:
                failures += 1
                if failures >= self.options.max_retries:
                    raise PushError(f"max retries exceeded: {exc}") from None
                delay = self.options.backoff(failures)
                log.info(
                    "%s upload attempt %d failed: %s; retrying in %.1fs",
                    self.digest[7:19],
                    failures,
                    exc,
                    delay,
                )
                await trio.sleep(delay)
                offset = None  # ask the registry where it stands
        self.skip()

    async def _resume(self, client: httpx.AsyncClient) -> int:
        """Where the upload stands: the registry's ``Range`` of the known upload, else a
        new upload (offset 0)."""
        what = f"push {self.digest[7:19]}"
        if self.location is not None:
            response = await registry_request(
                client, "GET", self.location, what, ok=(200, 204, 404)
            )
            if response.status_code != 404:
                self._follow(response)
                held = _held(response)
                if held:
                    log.info("%s: resuming at byte %d of %d", what, held, self.total)
                return held
            log.info("%s: the registry forgot the upload; starting again", what)
        url = f"{self.repo_url}/blobs/uploads/"
        response = await registry_request(client, "POST", url, what, ok=(202,))
        if not response.headers.get("location"):
            raise PushError(f"{what}: the registry named no upload location")
        self._follow(response)
        return 0

    def _follow(self, response: httpx.Response) -> None:
        """The registry's next URL for this upload (distribution changes it each time)."""
        location = response.headers.get("docker-upload-location") or response.headers.get(
            "location"
        )
        if location:
            self.location = str(response.url.join(location))

    async def _send_chunk(self, client: httpx.AsyncClient, offset: int) -> int:
        """PATCH the bytes from ``offset`` on (one chunk); the offset the registry then holds."""
        assert self.location is not None
        stop = min(offset + self.options.chunk_size, self.total)
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(stop - offset),
            "Content-Range": f"{offset}-{stop - 1}",
        }
        what = f"push {self.digest[7:19]}"
        fd = await trio.to_thread.run_sync(os.open, self.path, os.O_RDONLY)
        try:
            with trio.move_on_after(self.options.stall_timeout) as stall:
                self._stall = stall
                response = await registry_request(
                    client,
                    "PATCH",
                    self.location,
                    what,
                    ok=(202, 204, 416),
                    content=_Chunk(self, fd, offset, stop),
                    headers=headers,
                )
        finally:
            self._stall = None
            os.close(fd)
        if stall.cancelled_caught:
            raise _Retryable(f"{what}: stalled")
        if response.status_code == 416:  # not where the registry stands: ask it
            raise _Retryable(f"{what}: the registry holds another range")
        self._follow(response)
        held = _held(response) if "range" in response.headers else stop
        if held < stop:
            log.info("%s: the registry kept %d of the bytes up to %d", what, held, stop)
        return held

    async def _complete(self, client: httpx.AsyncClient) -> None:
        """PUT ``?digest=``: the registry checks the blob and makes it one."""
        assert self.location is not None
        url = httpx.URL(self.location).copy_merge_params({"digest": self.digest})
        headers = {"Content-Type": "application/octet-stream", "Content-Length": "0"}
        what = f"push {self.digest[7:19]}"
        response = await registry_request(
            client, "PUT", url, what, ok=(201, 204, 404), headers=headers
        )
        if response.status_code == 404:
            self.location = None  # the registry lost the upload: a new one
            raise _Retryable(f"{what}: the registry no longer knows the upload")


def _held(response: httpx.Response) -> int:
    """Bytes the registry holds, from ``Range: 0-<last byte>`` (``0--1``: none)."""
    match = _RANGE_RE.fullmatch(response.headers.get("range", "").strip())
    return max(int(match[1]) + 1, 0) if match else 0
