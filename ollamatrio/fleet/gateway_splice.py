"""A streamed answer's body from the host's socket to the client's, off the event loop.

Relaying a token through Trio costs one trip through its scheduler: the host's socket armed
again in epoll, the task woken and stepped, a read, a write (about 30 µs of CPU a token on a
two-core VM, most of it the scheduler's, scripts/bench_fleet.py).  The same read and write
from a plain ``poll`` loop cost about a third of that.  So once the answer's head is out, a
chunked answer (every streamed one: NDJSON and SSE) is spliced by :func:`pump` in a worker
thread: it reads what the host writes and writes it to the client's socket as it is, the
host's chunk framing unchanged (the front door frames a streamed body in chunks too), and
tracks only where the chunks end (:class:`ChunkFraming`), to know the body's end.

The Trio side (:func:`splice`) waits for the thread inside a nursery whose other task turns
a cancellation (the client left, the server stops) into a byte on a pipe the thread polls,
so the thread never outlives the request and the request's cancellation is never lost.
"""

from __future__ import annotations

import errno
import os
import select
from dataclasses import dataclass
from typing import Final, Literal

import trio

READ_SIZE: Final = 65536
SEND_TIMEOUT_MS: Final = 10_000  # a client that reads nothing for this long is gone
MAX_PUMPS: Final = 4096
# One thread per stream being spliced; Trio's default limiter (40 threads) is for short
# jobs and would make the 41st stream wait for another to end.  One limiter per Trio run.
_PUMPS: Final = trio.lowlevel.RunVar[trio.CapacityLimiter]("fleet_pumps")


class FramingError(Exception):
    """The host's chunked body is malformed."""


class ChunkFraming:
    """Where a chunked body ends, read piece by piece without copying its data."""

    def __init__(self) -> None:
        self._need = 0  # bytes of the current chunk (its data and CRLF) still to come
        self._line = bytearray()  # a size or trailer line, not yet whole
        self._trailers = False  # past the last (zero-size) chunk
        self.finished = False

    @property
    def at_boundary(self) -> bool:
        """Whether what was fed so far ends between two chunks."""
        return not self._need and not self._line and not self._trailers

    def feed(self, data: bytes) -> int | None:
        """Track ``data``; the offset just past the body's end if it ends in it.

        Raises:
            FramingError: a chunk size line that is no hexadecimal number.
        """
        pos, end = 0, len(data)
        while pos < end:
            if self._need:
                take = min(self._need, end - pos)
                pos += take
                self._need -= take
                continue
            eol = data.find(b"\n", pos)
            if eol < 0:
                self._line += data[pos:]
                return None
            if self._line:
                self._line += data[pos:eol]
                line = bytes(self._line)
                self._line.clear()
            else:
                line = data[pos:eol]
            pos = eol + 1
            line = line.rstrip(b"\r")
            if self._trailers:
                if not line:
                    self.finished = True
                    return pos
                continue
            try:
                size = int(line.split(b";", 1)[0], 16)
            except ValueError:
                raise FramingError(f"bad chunk size line from the host: {line[:40]!r}") from None
            if size:
                self._need = size + 2
            else:
                self._trailers = True
        return None


Outcome = Literal["done", "host_failed", "client_left", "stopped"]


@dataclass
class Pumped:
    outcome: Outcome
    leftover: bytes = b""  # bytes after the body's end ("done")
    error: str = ""  # what failed ("host_failed")
    at_boundary: bool = True  # the client got whole chunks only


def pump(first: bytes, host_fd: int, client_fd: int, stop_fd: int) -> Pumped:
    """In a worker thread: pass the host's chunked body on to the client until its end, a
    failure on either side, or a byte on ``stop_fd``.  ``first``: body bytes already read."""
    framing = ChunkFraming()
    poller = select.poll()
    poller.register(host_fd, select.POLLIN)
    poller.register(stop_fd, select.POLLIN)
    data = first
    while True:
        if data:
            try:
                end = framing.feed(data)
            except FramingError as exc:
                return Pumped("host_failed", error=str(exc), at_boundary=False)
            piece = data if end is None else data[:end]
            if not _write_all(client_fd, piece, stop_fd):
                return Pumped("client_left")
            if end is not None:
                return Pumped("done", leftover=data[end:])
        for fd, _ in poller.poll():
            if fd == stop_fd:
                return Pumped("stopped")
        try:
            data = os.read(host_fd, READ_SIZE)
        except BlockingIOError:
            data = b""
            continue
        except OSError as exc:
            return Pumped("host_failed", error=str(exc), at_boundary=framing.at_boundary)
        if not data:
            error = "the host closed the connection mid-response"
            return Pumped("host_failed", error=error, at_boundary=framing.at_boundary)


def _write_all(fd: int, data: bytes, stop_fd: int) -> bool:
    """Write ``data`` whole to a non-blocking socket; False if the client is gone (or does
    not read for ``SEND_TIMEOUT_MS``, or the request is stopped meanwhile)."""
    view = memoryview(data)
    while view:
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            return False
        view = view[sent:]
        if view:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.register(stop_fd, select.POLLIN)
            ready = poller.poll(SEND_TIMEOUT_MS)
            if not ready or any(fd == stop_fd for fd, _ in ready):
                return False
    return True


async def splice(first: bytes, host_fd: int, client_fd: int) -> Pumped:
    """:func:`pump` in a worker thread, stopped when this task is cancelled."""
    try:
        limiter = _PUMPS.get()
    except LookupError:
        limiter = trio.CapacityLimiter(MAX_PUMPS)
        _PUMPS.set(limiter)
    stop_read, stop_write = os.pipe()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_cancel, stop_write)
            pumped = await trio.to_thread.run_sync(
                pump, first, host_fd, client_fd, stop_read, limiter=limiter
            )
            nursery.cancel_scope.cancel()
        return pumped
    finally:
        os.close(stop_read)
        os.close(stop_write)


async def _stop_on_cancel(stop_write: int) -> None:
    try:
        await trio.sleep_forever()
    finally:
        os.write(stop_write, b"x")  # the pump returns; the thread is waited for
