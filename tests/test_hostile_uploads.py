"""Hostile uploads: blob bodies larger than the server could hold, faster than its disk.

``POST /api/blobs/<digest>`` must stream to disk with backpressure, whatever the framing:
a 1 GiB upload (right digest and wrong, ``Content-Length`` and chunked) raises the server's
resident memory by at most 64 MiB, and a wrong digest is a 400 with nothing left in the
store.  The server runs as its own process here (``python -m ollamatrio serve``) so that
its RSS is its own; the client sends one 1 MiB block over and over and never holds the
body (``ollamatrio/testing/uploads.py``).  A test in the server's own trio run shows the
mechanism: with the disk held up, the server stops reading the connection after a few
pieces, on the front door (``Content-Length``) and on hypercorn (chunked) alike.
"""

from __future__ import annotations

import errno
import hashlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import trio
import trio.testing

from ollamatrio.store import BlobWriter, blob_filename
from ollamatrio.testing.uploads import (
    MIB,
    WRONG_DIGEST,
    RssWatch,
    block_of,
    digest_of,
    pieces,
    server_process,
    upload,
)

FRAMINGS = [False, True]
FRAMING_IDS = ["content-length", "chunked"]


def _upload_and_watch(
    tmp_path: Path, size: int, *, chunked: bool, right: bool, disk_rate: float | None = None
) -> int:
    """Upload ``size`` bytes to a fresh server process; the rise of its RSS.  The store's
    blobs folder must then hold the blob (right digest) or nothing at all."""
    block = block_of("random")  # zeros would become holes: the disk would never fall behind
    digest = digest_of(block, size) if right else WRONG_DIGEST
    with server_process(tmp_path / "models", disk_rate=disk_rate) as srv:
        with RssWatch(srv.proc.pid) as watch:
            answer = upload(srv.address, digest, block, size, chunked=chunked)
        assert answer.sent == size
        if right:
            assert answer.status == 201, answer.body
            assert srv.blob_files() == [blob_filename(digest)]
            blob = srv.models / "blobs" / blob_filename(digest)
            assert blob.stat().st_size == size
            blob.unlink()  # pytest keeps the last runs' folders: not a GiB each
        else:
            assert answer.status == 400, answer.body
            assert b"digest mismatch" in answer.body
            assert srv.blob_files() == []  # no blob, no temporary file
        assert srv.proc.poll() is None
        return watch.rise


@pytest.mark.slow
@pytest.mark.parametrize("chunked", FRAMINGS, ids=FRAMING_IDS)
@pytest.mark.parametrize("right", [True, False], ids=["right-digest", "wrong-digest"])
def test_a_1_gib_upload_raises_the_servers_rss_by_at_most_64_mib(
    tmp_path: Path, chunked: bool, right: bool
) -> None:
    rise = _upload_and_watch(tmp_path, 1024 * MIB, chunked=chunked, right=right)
    assert rise <= 64 * MIB, f"RSS rose by {rise / MIB:.0f} MiB"


@pytest.mark.parametrize("chunked", FRAMINGS, ids=FRAMING_IDS)
@pytest.mark.parametrize("right", [True, False], ids=["right-digest", "wrong-digest"])
def test_an_upload_faster_than_the_disk_raises_the_rss_by_at_most_16_mib(
    tmp_path: Path, chunked: bool, right: bool
) -> None:
    """The fast variant: 128 MiB to a store that writes 256 MiB a second."""
    rise = _upload_and_watch(tmp_path, 128 * MIB, chunked=chunked, right=right, disk_rate=256 * MIB)
    assert rise <= 16 * MIB, f"RSS rose by {rise / MIB:.0f} MiB"


# -- the mechanism: the server reads only as fast as the disk takes it --------------------

BODY = 128 * MIB
# What may be in flight while the disk is held: the upload's own batches (a few MiB) and
# the kernel's socket buffers on both ends (loopback autotuning: up to tcp_rmem's maximum,
# 32 MiB here, plus the sender's).  Without backpressure the whole body is taken.
AHEAD = 32 * MIB


class Sender:
    """A client sending ``size`` bytes of ``block`` repeats as one upload; ``sent`` counts
    the body bytes the connection has taken so far."""

    def __init__(
        self, stream: trio.SocketStream, block: bytes, size: int, chunked: bool,
        declared: int | None = None,
    ) -> None:  # fmt: skip
        self.stream = stream
        self.block = block
        self.size = size
        self.declared = size if declared is None else declared  # the Content-Length
        self.chunked = chunked
        self.sent = 0

    async def send(self, url: str, digest: str, *, end: bool = True) -> None:
        """The head and the body (its last chunk only if ``end``)."""
        if self.chunked:
            framing = b"Transfer-Encoding: chunked"
        else:
            framing = b"Content-Length: %d" % self.declared
        host = urlsplit(url).netloc.encode()
        await self.stream.send_all(
            b"POST /api/blobs/%s HTTP/1.1\r\nHost: %s\r\n%s\r\n\r\n"
            % (digest.encode(), host, framing)
        )
        for piece in pieces(self.block, self.size):
            if self.chunked:
                await self.stream.send_all(b"%x\r\n%s\r\n" % (len(piece), piece))
            else:
                await self.stream.send_all(piece)
            self.sent += len(piece)
        if self.chunked and end:
            await self.stream.send_all(b"0\r\n\r\n")

    async def status_line(self) -> bytes:
        answer = bytearray()
        while b"\r\n" not in answer:
            data = await self.stream.receive_some()
            assert data, "the server closed the connection"
            answer += data
        return bytes(answer.partition(b"\r\n")[0])


def file_digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(MIB):
            sha.update(data)
    return "sha256:" + sha.hexdigest()


@pytest.mark.parametrize("chunked", FRAMINGS, ids=FRAMING_IDS)
async def test_with_the_disk_held_up_the_server_stops_reading_the_upload(
    api_server, monkeypatch, chunked: bool
) -> None:
    release = threading.Event()
    writing = trio.Event()
    write = BlobWriter.write

    def held_write(self: BlobWriter, data: bytes | bytearray | memoryview) -> None:
        trio.from_thread.run_sync(writing.set)  # a worker thread of the server's run
        assert release.wait(60), "the test never let the disk go on"
        write(self, data)

    block = block_of("random")
    digest = digest_of(block, BODY)
    try:
        with trio.fail_after(60):
            async with api_server() as srv:
                monkeypatch.setattr(BlobWriter, "write", held_write)  # the store is ready
                parts = urlsplit(srv.url)
                stream = await trio.open_tcp_stream(parts.hostname or "", parts.port or 0)
                async with stream:
                    client = Sender(stream, block, BODY, chunked)
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(client.send, srv.url, digest)
                        # The disk is held at its first write; then all is blocked: the
                        # client on a full socket, the server on the disk.
                        await writing.wait()
                        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                        took = client.sent
                        release.set()
                    assert took <= AHEAD, f"the server took {took / MIB:.0f} MiB ahead"
                    assert (await client.status_line()).startswith(b"HTTP/1.1 201 ")
                    assert file_digest(srv.store.blob_path(digest)) == digest
                    print(f"taken ahead of the disk: {took / MIB:.0f} MiB")
    finally:
        release.set()


# -- uploads that end badly leave nothing behind --------------------------------------------


async def test_a_client_that_leaves_mid_upload_leaves_no_file(api_server) -> None:
    block = block_of("random")
    digest = digest_of(block, 64 * MIB)
    with trio.fail_after(30):
        async with api_server() as srv:
            before = sorted(p.name for p in srv.store.blobs_dir.iterdir())
            parts = urlsplit(srv.url)
            for chunked in FRAMINGS:
                stream = await trio.open_tcp_stream(parts.hostname or "", parts.port or 0)
                async with stream:  # promises 64 MiB, sends 8 and leaves
                    await Sender(stream, block, 8 * MIB, chunked, declared=64 * MIB).send(
                        srv.url, digest, end=False
                    )
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                assert sorted(p.name for p in srv.store.blobs_dir.iterdir()) == before
                assert not srv.store.has_blob(digest)
            async with httpx.AsyncClient(base_url=srv.url) as c:
                assert (await c.get("/api/version")).status_code == 200


@pytest.mark.parametrize("chunked", FRAMINGS, ids=FRAMING_IDS)
async def test_a_disk_that_fails_mid_upload_is_500_and_leaves_no_file(
    api_server, monkeypatch, chunked: bool
) -> None:
    def full_disk(self: BlobWriter, data: bytes | bytearray | memoryview) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    block = block_of("random")
    size = 16 * MIB
    digest = digest_of(block, size)

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces(block, size):
            yield bytes(piece)

    length = {} if chunked else {"Content-Length": str(size)}
    with trio.fail_after(30):
        async with api_server() as srv:
            monkeypatch.setattr(BlobWriter, "write", full_disk)  # the store is ready
            before = sorted(p.name for p in srv.store.blobs_dir.iterdir())
            async with httpx.AsyncClient(base_url=srv.url) as c:
                r = await c.post(f"/api/blobs/{digest}", content=body(), headers=length)
                assert r.status_code == 500
                assert "no space left on device" in r.json()["error"].lower()
            assert sorted(p.name for p in srv.store.blobs_dir.iterdir()) == before
