"""Resumable, parallel, verified blob downloads in Ollama's partial-file layout.

A blob being downloaded lives next to its final place in ``blobs/``::

    sha256-<hex>-partial        the data, written at each part's offset (sparse until done)
    sha256-<hex>-partial-<N>    JSON of part N: {"N", "Offset", "Size", "Completed"}

This is Ollama's own layout (``server/download.go``), so a download interrupted here can
be resumed by either server.  Each part is fetched with an HTTP ``Range`` request from
where it stopped; a bounded number run at once; each is retried a few times on network
errors (with a bounded backoff) and restarted when it stalls.  The data only becomes
``sha256-<hex>`` after its SHA-256 has been checked.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from ..errors import OllamatrioError
from .manifest import blob_filename, parse_digest
from .store import ModelStore, PinSet

log = logging.getLogger("ollamatrio.store.download")

_MB = 1000 * 1000  # Ollama's format.MegaByte
_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_HASH_BLOCK = 8 << 20


class PullError(OllamatrioError):
    """A pull failed; the message is what Ollama would say where Ollama has a message."""


class _Retryable(Exception):
    """A network failure worth another attempt (connection lost, 5xx, short body)."""


@dataclass(frozen=True)
class DownloadOptions:
    """How blobs are split and fetched; the defaults are Ollama's."""

    max_parts: int = 16  # a blob is cut into about this many parts...
    min_part_size: int = 100 * _MB  # ...of at least this size...
    max_part_size: int = 1000 * _MB  # ...and at most this one
    max_concurrent_parts: int = 16
    max_retries: int = 6  # attempts per part that end in a network error
    backoff_base: float = 1.0  # seconds before the 2nd attempt, doubling each time...
    backoff_max: float = 30.0  # ...up to this
    stall_timeout: float = 30.0  # a part that receives nothing for this long is restarted
    write_buffer: int = 1 << 20  # bytes gathered before each write (and progress event)
    heartbeat: float = 1.0  # progress is re-sent this often while nothing moves, so a
    # consumer that went away is noticed even during a stall

    def backoff(self, failures: int) -> float:
        return min(self.backoff_base * 2.0 ** (failures - 1), self.backoff_max)


@dataclass
class Part:
    """One byte range of a blob and how much of it is on disk."""

    n: int
    offset: int
    size: int
    completed: int = 0

    @property
    def start(self) -> int:
        return self.offset + self.completed

    @property
    def stop(self) -> int:
        return self.offset + self.size

    @property
    def done(self) -> bool:
        return self.completed >= self.size

    def to_json(self, completed: int | None = None) -> bytes:
        done = self.completed if completed is None else completed
        body = {"N": self.n, "Offset": self.offset, "Size": self.size, "Completed": done}
        return (json.dumps(body, separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> Part:
        obj = json.loads(data)
        fields = [obj.get(key) for key in ("N", "Offset", "Size", "Completed")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in fields):
            raise ValueError(f"bad part record {obj!r}")
        n, offset, size, completed = fields
        return cls(n=n, offset=offset, size=size, completed=min(completed, size))


def plan_parts(total: int, options: DownloadOptions) -> list[Part]:
    """Ollama's split: ``total / max_parts`` clamped to [min_part_size, max_part_size]."""
    size = min(
        max(total // max(options.max_parts, 1), options.min_part_size), options.max_part_size
    )
    size = max(size, 1)
    return [
        Part(n=i, offset=offset, size=min(size, total - offset))
        for i, offset in enumerate(range(0, total, size))
    ]


def status_error(what: str, response: httpx.Response) -> str:
    """Ollama's wording for an HTTP failure: 404 is "file does not exist", else "<code>: <body>"."""
    if response.status_code == 404:
        return f"{what}: file does not exist"
    body = response.text.strip()[:512] if response.is_stream_consumed else ""
    return f"{what}: {response.status_code}: {body}"


class BlobDownload:
    """Download one blob into ``<blob>-partial``, then verify it and move it into place.

    Every change of progress sets the current :attr:`changed` event (and swaps in a new
    one), so any number of tasks can follow one download without polling.
    """

    def __init__(self, store: ModelStore, digest: str, total: int, options: DownloadOptions):
        self.store = store
        self.digest = parse_digest(digest)
        self.total = total
        self.options = options
        self.final = store.blob_path(self.digest)
        self.partial = store.blobs_dir / (blob_filename(self.digest) + "-partial")
        self.parts: list[Part] = []
        self.completed = 0
        self.finished = False  # every byte is in the partial file
        self.released = trio.Event()  # set when the pull that owns this download lets go
        self._changed = trio.Event()

    # -- progress ------------------------------------------------------------------------

    def progress(self) -> dict[str, Any]:
        return progress_event(self.digest, self.total, self.completed)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    @property
    def changed(self) -> trio.Event:
        """Set at the next change of progress or state (take it before awaiting anything)."""
        return self._changed

    def release(self) -> None:
        self.released.set()
        self._notify()

    # -- files ---------------------------------------------------------------------------

    def part_path(self, n: int) -> Path:
        return self.partial.with_name(f"{self.partial.name}-{n}")

    def _part_files(self) -> list[Path]:
        prefix = self.partial.name + "-"
        return [
            p
            for p in self.store.blobs_dir.iterdir()
            if p.name.startswith(prefix) and p.name[len(prefix) :].isdigit()
        ]

    def discard(self) -> None:
        """Remove the partial data and every part record."""
        for path in [self.partial, *self._part_files()]:
            path.unlink(missing_ok=True)

    def prepare(self) -> None:
        """Resume from the part records on disk when they describe this blob; else start over.

        Synchronous (run it in a thread): it reads a handful of small files.
        """
        parts = self._read_parts()
        if parts is None:
            self.discard()
            parts = plan_parts(self.total, self.options)
            for part in parts:
                self.part_path(part.n).write_bytes(part.to_json())
        with open(self.partial, "ab") as f:  # create it; keep what a resume needs
            f.truncate(self.total)
        self.parts = parts
        self.completed = sum(p.completed for p in parts)
        self.finished = all(p.done for p in parts)
        if parts and self.completed:
            log.info(
                "resuming %s: %d of %d bytes already downloaded",
                self.digest[7:19],
                self.completed,
                self.total,
            )

    def _read_parts(self) -> list[Part] | None:
        """The recorded parts if they tile ``[0, total)`` and the data file exists."""
        files = self._part_files()
        if not files or not self.partial.is_file():
            return None
        try:
            parts = sorted((Part.from_json(p.read_bytes()) for p in files), key=lambda p: p.n)
        except (OSError, ValueError) as exc:
            log.warning("discarding unreadable partial download of %s: %s", self.digest, exc)
            return None
        offset = 0
        for i, part in enumerate(parts):
            if part.n != i or part.offset != offset or part.size <= 0:
                return None
            offset += part.size
        if offset != self.total or self.partial.stat().st_size > self.total:
            return None
        return parts

    # -- fetching ------------------------------------------------------------------------

    async def run(self, client: httpx.AsyncClient, url: str) -> None:
        """Fetch every unfinished part; returns once the partial file holds the whole blob."""
        if not self.finished:
            fd = os.open(self.partial, os.O_RDWR)
            try:
                # Parts start in offset order, a bounded number at a time.
                slots = trio.Semaphore(max(self.options.max_concurrent_parts, 1))
                async with trio.open_nursery() as nursery:
                    for part in self.parts:
                        if not part.done:
                            await slots.acquire()
                            nursery.start_soon(self._fetch_part, client, url, fd, part, slots)
            finally:
                os.close(fd)
        self.finished = True
        self._notify()

    async def _fetch_part(
        self,
        client: httpx.AsyncClient,
        url: str,
        fd: int,
        part: Part,
        slots: trio.Semaphore,
    ) -> None:
        try:
            failures = 0
            while not part.done:
                before = part.completed
                try:
                    stalled = await self._fetch_once(client, url, fd, part)
                except _Retryable as exc:
                    failures += 1
                    if failures >= self.options.max_retries:
                        raise PullError(f"max retries exceeded: {exc}") from None
                    delay = self.options.backoff(failures)
                    log.info(
                        "%s part %d attempt %d failed: %s; retrying in %.1fs",
                        self.digest[7:19],
                        part.n,
                        failures,
                        exc,
                        delay,
                    )
                    await trio.sleep(delay)
                    continue
                if stalled:
                    log.info("%s part %d stalled; retrying", self.digest[7:19], part.n)
                    # A slow link that still moves data keeps its attempts (as in Ollama);
                    # one that delivered nothing at all uses one up.
                    if part.completed == before:
                        failures += 1
                        if failures >= self.options.max_retries:
                            raise PullError("max retries exceeded: part stalled")
        finally:
            slots.release()

    async def _fetch_once(self, client: httpx.AsyncClient, url: str, fd: int, part: Part) -> bool:
        """One ranged GET for the rest of ``part``; returns True if it stalled."""
        buffer = bytearray()
        failure: _Retryable | None = None
        headers = {"Range": f"bytes={part.start}-{part.stop - 1}"}
        with trio.move_on_after(self.options.stall_timeout) as stall:
            try:
                # Each attempt asks the registry and follows its redirect (to a CDN), so a
                # retry never reuses a signed URL that may have expired.
                async with client.stream(
                    "GET", url, headers=headers, follow_redirects=True
                ) as response:
                    skip = await self._check_range(response, part)
                    async for chunk in response.aiter_bytes():
                        stall.relative_deadline = self.options.stall_timeout
                        if skip:
                            dropped = min(skip, len(chunk))
                            chunk, skip = chunk[dropped:], skip - dropped
                        buffer += chunk[: part.size - part.completed - len(buffer)]
                        if len(buffer) >= self.options.write_buffer:
                            await self._flush(fd, part, buffer)
                            buffer.clear()
                        if part.completed + len(buffer) >= part.size:
                            break
            except httpx.TransportError as exc:
                failure = _Retryable(str(exc) or type(exc).__name__)
        # What arrived before a failure or a stall is kept: the next attempt resumes after it.
        if buffer:
            await self._flush(fd, part, buffer)
        if failure is not None:
            raise failure
        if stall.cancelled_caught:
            return True
        if not part.done:
            raise _Retryable(f"connection closed after {part.completed} of {part.size} bytes")
        return False

    async def _check_range(self, response: httpx.Response, part: Part) -> int:
        """Bytes to skip at the start of the body (a server that ignored ``Range``)."""
        status = response.status_code
        if status == 206:
            match = _CONTENT_RANGE_RE.fullmatch(response.headers.get("content-range", ""))
            if match is None or int(match.group(1)) != part.start:
                raise PullError(
                    f"download {self.digest[7:19]}: registry answered the wrong range "
                    f"({response.headers.get('content-range')!r} for bytes {part.start}-)"
                )
            return 0
        if status == 200:
            return part.start
        await response.aread()
        if status == 429 or status >= 500:
            raise _Retryable(status_error(f"download {self.digest[7:19]}", response))
        raise PullError(status_error(f"download {self.digest[7:19]}", response))

    async def _flush(self, fd: int, part: Part, data: bytearray) -> None:
        payload = bytes(data)
        completed = part.completed + len(payload)
        record = part.to_json(completed)
        await trio.to_thread.run_sync(
            _write_part, fd, payload, part.start, self.part_path(part.n), record
        )
        # The thread has finished; account for the bytes before any other checkpoint.
        part.completed = completed
        self.completed += len(payload)
        self._notify()

    # -- verifying -----------------------------------------------------------------------

    async def verify_and_install(self, pins: PinSet) -> None:
        """Check the SHA-256 of the partial file, then rename it to ``sha256-<hex>``.

        A mismatch removes the partial download (it must be fetched again) and raises
        Ollama's "digest mismatch" error.
        """
        await trio.to_thread.run_sync(self._verify_and_install, pins)

    def _verify_and_install(self, pins: PinSet) -> None:
        actual = _sha256_file(self.partial)
        if actual != self.digest:
            self.discard()
            raise PullError(
                f"digest mismatch, file must be downloaded again: want {self.digest}, got {actual}"
            )
        pins.add(self.digest)  # pinned before it exists, so no prune can take it
        os.chmod(self.partial, 0o644)
        os.replace(self.partial, self.final)
        for path in self._part_files():
            path.unlink(missing_ok=True)


def progress_event(digest: str, total: int, completed: int) -> dict[str, Any]:
    """Ollama's per-blob progress line; zero counts are left out as Go's omitempty does."""
    event: dict[str, Any] = {"status": f"pulling {digest[7:19]}", "digest": digest}
    if total:
        event["total"] = total
    if completed:
        event["completed"] = completed
    return event


def _write_part(fd: int, data: bytes, offset: int, record_path: Path, record: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written
    # The record is written after the data, so it never claims bytes that are not there.
    record_path.write_bytes(record)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            trio.from_thread.check_cancelled()
            digest.update(block)
    return "sha256:" + digest.hexdigest()
