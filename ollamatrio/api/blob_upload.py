"""``POST /api/blobs/<digest>``: the request body streamed into the store with backpressure.

Quart reads a request body into its own queue as fast as the connection delivers it, so a
body that arrives faster than the disk takes it was held in memory (a 1 GiB upload raised
the server's RSS by 1.3 GiB).  This route runs as plain ASGI ahead of Quart
(``api/routes.py``) and asks ASGI ``receive`` for the next piece only when there is room
for it: the pieces are gathered into batches that go through a channel of a few batches to
one writer task, which hashes and writes each in a worker thread.  While the channel is
full nothing reads the connection, so the socket buffers fill and the client waits.  That
holds for every framing the transport hands over piece by piece: ``Content-Length`` bodies
on the front door (``http/asgi.py`` reads the socket inside ``receive``) and chunked ones on
hypercorn (whose queue to the app is bounded).  At most ``QUEUED + 2`` batches are held.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..errors import InvalidRequestError
from ..store import BlobWriter, ModelStore, parse_digest

PREFIX = "/api/blobs/"
ENDPOINT = "/api/blobs/<digest>"  # the metrics label (as Quart's rule would be)
BATCH = 1 << 20  # bytes per write in the worker thread
QUEUED = 4  # batches waiting for the writer

Receive = Callable[[], Awaitable[dict[str, Any]]]


async def upload_blob(store: ModelStore, digest: str, receive: Receive) -> int | None:
    """Store the request body as blob ``digest``, as Ollama answers: 201 if it is new, 200 if
    it was already there (the body is read and dropped); None if the client left first.  A
    malformed digest or a body of another digest raises :class:`InvalidRequestError` (400),
    and nothing is left in the store."""
    try:
        digest = parse_digest(digest)
        present = await trio.to_thread.run_sync(store.has_blob, digest)
    except InvalidRequestError:
        await _discard(receive)  # an unread body would hold up the client's next request
        raise
    if present:
        return 200 if await _discard(receive) else None
    writer = await trio.to_thread.run_sync(store.blob_writer, digest)
    with writer:  # left without a commit (the client left, a mismatch): the file goes
        if not await _stream(receive, writer):
            return None
        await trio.to_thread.run_sync(writer.commit)  # raises on a mismatch
    return 201 if writer.created else 200


async def _stream(receive: Receive, writer: BlobWriter) -> bool:
    """The whole body through ``writer``; False if the client left before its end."""
    failed: list[Exception] = []
    send_batch, batches = trio.open_memory_channel[bytes](QUEUED)

    async def write_batches(cancel: trio.CancelScope) -> None:
        async with batches:
            try:
                async for batch in batches:
                    await trio.to_thread.run_sync(writer.write, batch)
            except Exception as exc:  # the disk is full, say: the receiving stops too
                failed.append(exc)
                cancel.cancel()

    complete = False
    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_batches, nursery.cancel_scope)
        async with send_batch:
            batch = bytearray()
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    nursery.cancel_scope.cancel()
                    break
                batch += message.get("body", b"")
                more = bool(message.get("more_body", False))
                if len(batch) >= BATCH or not more:
                    await send_batch.send(bytes(batch))  # waits while the writer is behind
                    batch.clear()
                if not more:
                    complete = True
                    break
    if failed:
        raise failed[0]
    return complete


async def _discard(receive: Receive) -> bool:
    """Read the body to its end and drop it; False if the client left first."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        if not message.get("more_body", False):
            return True
