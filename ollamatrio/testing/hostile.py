"""Hostile clients for the soak (``scripts/soak.py --hostile``): raw-socket probes of the
HTTP layer's edges, run beside the normal traffic.

Each probe opens its own connection to the server, does one thing a careless or hostile
client does, and checks the server answers it as designed:

* ``slow_body``: a ``Content-Length`` body that stalls after its first byte: ``408`` (or a
  close) within the body-read timeout and a little more;
* ``half_close``: a whole ``/api/generate`` request, then ``shutdown(SHUT_WR)``: served (or
  treated as a disconnect), never a 5xx;
* ``http10``: a streamed ``/api/generate`` over HTTP/1.0: the stream ends with a close;
* ``h2_preface``: HTTP/2's prior-knowledge preface: refused (a 4xx, or a close);
* ``h2c_upgrade``: ``Upgrade: h2c`` on ``/api/version``: ignored, answered as HTTP/1.1 200;
* ``duplicate_host``: two ``Host`` headers: ``400``;
* ``bad_host``: a ``Host`` with an empty label: ``400``;
* ``oversize_upload``: a blob upload whose digest does not match: ``400``.

Every probe is bounded in time (``Hostile.limit`` seconds past what it waits for by design)
and records one :class:`Probe`: ``as_designed`` or not, with what it saw.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

ZERO_DIGEST = "sha256:" + "0" * 64  # no upload of non-zero bytes hashes to this
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@dataclass
class Probe:
    kind: str
    as_designed: bool
    seen: str  # what the server answered (status line, or how the connection ended)
    seconds: float


@dataclass
class Hostile:
    host: str
    port: int
    model: str  # a chat model in the server's store
    body_timeout: float  # the server's body-read timeout (seconds)
    upload_bytes: int = 32 << 20
    limit: float = 10.0  # seconds any probe may wait beyond what it waits for by design
    probes: list[Probe] = field(default_factory=list)

    async def _connect(self) -> trio.SocketStream:
        return await trio.open_tcp_stream(self.host, self.port)

    async def _read_all(self, stream: trio.SocketStream, seconds: float) -> tuple[bytes, bool]:
        """What the server sends until it closes; (bytes, closed within ``seconds``)."""
        data = bytearray()
        with trio.move_on_after(seconds):
            while True:
                try:
                    piece = await stream.receive_some(65536)
                except trio.BrokenResourceError:  # a reset is a close too
                    return bytes(data), True
                if not piece:
                    return bytes(data), True
                data += piece
        return bytes(data), False

    def _record(self, kind: str, started: float, ok: bool, seen: str) -> None:
        self.probes.append(Probe(kind, ok, seen, time.monotonic() - started))

    def _head(self, method: str, path: str, *extra: str, version: str = "1.1") -> bytes:
        lines = [f"{method} {path} HTTP/{version}", *extra]
        if not any(line.lower().startswith("host:") for line in extra):
            lines.insert(1, f"Host: {self.host}:{self.port}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    # -- the probes -----------------------------------------------------------------------

    async def slow_body(self) -> None:
        started = time.monotonic()
        body = json.dumps({"model": self.model}).encode()
        async with await self._connect() as stream:
            # The head and one byte of the body, then nothing: the body stalls.
            await stream.send_all(
                self._head("POST", "/api/show", f"Content-Length: {len(body)}") + body[:1]
            )
            answer, closed = await self._read_all(stream, self.body_timeout + self.limit)
        status = status_of(answer)
        self._record("slow_body", started, closed and status in (408, 0), describe(status, closed))

    async def half_close(self) -> None:
        started = time.monotonic()
        body = json.dumps({
            "model": self.model, "prompt": "hi", "stream": False,
            "options": {"num_predict": 4},
        }).encode()  # fmt: skip
        async with await self._connect() as stream:
            await stream.send_all(
                self._head("POST", "/api/generate", f"Content-Length: {len(body)}") + body
            )
            await stream.send_eof()
            answer, closed = await self._read_all(stream, 60.0)
        status = status_of(answer)
        self._record("half_close", started, closed and status < 500, describe(status, closed))

    async def http10(self) -> None:
        started = time.monotonic()
        body = json.dumps({
            "model": self.model, "prompt": "hi", "options": {"num_predict": 8},
        }).encode()  # fmt: skip
        async with await self._connect() as stream:
            await stream.send_all(
                self._head("POST", "/api/generate", f"Content-Length: {len(body)}", version="1.0")
                + body
            )
            answer, closed = await self._read_all(stream, 60.0)
        status = status_of(answer)
        done = b'"done":true' in answer
        self._record("http10", started, closed and status == 200 and done, describe(status, closed))

    async def h2_preface(self) -> None:
        started = time.monotonic()
        async with await self._connect() as stream:
            await stream.send_all(H2_PREFACE)
            answer, closed = await self._read_all(stream, self.limit)
        status = status_of(answer)
        ok = closed and (status == 0 or 400 <= status < 500)
        self._record("h2_preface", started, ok, describe(status, closed))

    async def h2c_upgrade(self) -> None:
        started = time.monotonic()
        async with await self._connect() as stream:
            await stream.send_all(self._head(
                "GET", "/api/version", "Connection: Upgrade, HTTP2-Settings, close",
                "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
            ))  # fmt: skip
            answer, closed = await self._read_all(stream, self.limit)
        status = status_of(answer)
        ok = answer.startswith(b"HTTP/1.1 200") and closed
        self._record("h2c_upgrade", started, ok, describe(status, closed))

    async def duplicate_host(self) -> None:
        await self._expect_400(
            "duplicate_host", "Host: evil.example.com", f"Host: 127.0.0.1:{self.port}"
        )

    async def bad_host(self) -> None:
        await self._expect_400("bad_host", "Host: a..localhost")

    async def _expect_400(self, kind: str, *headers: str) -> None:
        started = time.monotonic()
        async with await self._connect() as stream:
            await stream.send_all(self._head("GET", "/api/tags", *headers, "Connection: close"))
            answer, closed = await self._read_all(stream, self.limit)
        status = status_of(answer)
        self._record(kind, started, status == 400, describe(status, closed))

    async def oversize_upload(self) -> None:
        started = time.monotonic()
        piece = bytes(1 << 20)
        async with await self._connect() as stream:
            await stream.send_all(self._head(
                "POST", f"/api/blobs/{ZERO_DIGEST}", f"Content-Length: {self.upload_bytes}",
                "Connection: close",
            ))  # fmt: skip
            try:
                for _ in range(self.upload_bytes // len(piece)):
                    await stream.send_all(piece)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # answered before the whole body: read what it said
            answer, closed = await self._read_all(stream, self.limit)
        status = status_of(answer)
        self._record("oversize_upload", started, status == 400, describe(status, closed))

    def kinds(self) -> dict[str, Callable[[], Awaitable[None]]]:
        return {
            "slow_body": self.slow_body,
            "half_close": self.half_close,
            "http10": self.http10,
            "h2_preface": self.h2_preface,
            "h2c_upgrade": self.h2c_upgrade,
            "duplicate_host": self.duplicate_host,
            "bad_host": self.bad_host,
            "oversize_upload": self.oversize_upload,
        }


def describe(status: int, closed: bool) -> str:
    """A probe's answer in a word: the status, and whether the server closed in time."""
    return f"{status or 'no response'}{'' if closed else ', left open'}"


def status_of(answer: bytes) -> int:
    """The status of the first response in ``answer``; 0 when there is none."""
    parts = answer.split(b" ", 2)
    if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
        return int(parts[1])
    return 0


async def run_hostile(
    hostile: Hostile, workers: int, seed: int, stop: trio.Event, max_probes: int
) -> None:
    """``workers`` hostile clients, each drawing probes from its own seeded generator until
    ``stop`` is set or ``max_probes`` probes were started in all.  A probe that fails to
    connect or breaks in transport is recorded as not as designed."""
    kinds = hostile.kinds()
    names = sorted(kinds)
    started = 0

    async def worker(index: int) -> None:
        nonlocal started
        rng = random.Random(seed * 1000 + index)
        while not stop.is_set() and started < max_probes:
            started += 1
            kind = rng.choice(names)
            begun = time.monotonic()
            try:
                await kinds[kind]()
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                hostile.probes.append(Probe(kind, False, f"{type(exc).__name__}: {exc}",
                                            time.monotonic() - begun))  # fmt: skip

    async with trio.open_nursery() as nursery:
        for i in range(workers):
            nursery.start_soon(worker, i)
        await stop.wait()
        # Probes in flight finish (each is bounded); no new ones start.


__all__ = ["H2_PREFACE", "Hostile", "Probe", "describe", "run_hostile", "status_of"]
