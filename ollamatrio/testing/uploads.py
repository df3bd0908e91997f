"""Large blob uploads against a server process, and that process's memory while they run.

A client that never holds the body: it sends one block (1 MiB) over and over, with
``Content-Length`` or chunked framing, under the digest of the whole (computed by a first
pass over the same blocks) or under a wrong one.  :class:`RssWatch` samples the server's
resident memory meanwhile (psutil) and reads the kernel's own high-water mark
(``VmHWM``, reset first through ``/proc/<pid>/clear_refs`` where the kernel allows it), so a
peak between two samples is not missed.  Used by ``tests/test_hostile_uploads.py`` and
``scripts/bench_upload.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil

BLOCK = 1 << 20
MIB = 1 << 20
WRONG_DIGEST = "sha256:" + "0" * 64
# The simulated engine's machine: no GPU, plenty of RAM (nothing is loaded anyway).
_SIMULATED_SYSTEM = json.dumps({"gpus": [], "system": {"total": 64 << 30, "cpu_count": 2}})
_LISTENING = re.compile(rb"Listening on http://([0-9.]+):(\d+)")
# A server whose store writes blobs at most RATE bytes a second (a slow disk): a server that
# reads an upload ahead of its disk then shows it at any size, not only once the kernel's
# writeback falls behind.  A worker thread's sleep stands for the disk's time.
_SLOW_DISK_SERVER = """
import sys, time
from ollamatrio.serve import run_server
from ollamatrio.store import BlobWriter
rate = float(sys.argv[1])
write = BlobWriter.write
def slow_write(self, data):
    time.sleep(len(data) / rate)
    write(self, data)
BlobWriter.write = slow_write
run_server()
"""


def block_of(pattern: str) -> bytes:
    """One block of a body: ``zeros`` (the store keeps it as holes, so the disk does little)
    or ``random`` (seeded, so every run sends the same bytes)."""
    if pattern == "zeros":
        return bytes(BLOCK)
    if pattern == "random":
        return random.Random(1).randbytes(BLOCK)
    raise ValueError(f"unknown pattern {pattern!r}")


def pieces(block: bytes, size: int) -> Iterator[memoryview]:
    """``size`` bytes as repeats of ``block`` (the last one cut)."""
    view = memoryview(block)
    left = size
    while left > 0:
        piece = view[: min(left, len(view))]
        left -= len(piece)
        yield piece


def digest_of(block: bytes, size: int) -> str:
    """The ``sha256:<hex>`` digest of the body :func:`pieces` sends."""
    sha = hashlib.sha256()
    for piece in pieces(block, size):
        sha.update(piece)
    return "sha256:" + sha.hexdigest()


@dataclass
class Upload:
    status: int  # 0: no answer
    body: bytes
    seconds: float
    sent: int  # body bytes the server took before it answered or closed


def upload(
    address: tuple[str, int], digest: str, block: bytes, size: int, *, chunked: bool,
    timeout: float = 300.0,
) -> Upload:  # fmt: skip
    """``POST /api/blobs/<digest>`` with ``size`` bytes of ``block`` repeats; the answer."""
    host, port = address
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % size
    head = b"POST /api/blobs/%s HTTP/1.1\r\nHost: %s:%d\r\n%s\r\n\r\n" % (
        digest.encode(), host.encode(), port, framing,
    )  # fmt: skip
    start = time.perf_counter()
    sent = 0
    with socket.create_connection(address, timeout=timeout) as sock:
        try:
            sock.sendall(head)
            for piece in pieces(block, size):
                if chunked:
                    sock.sendall(b"%x\r\n" % len(piece))
                sock.sendall(piece)
                if chunked:
                    sock.sendall(b"\r\n")
                sent += len(piece)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered before the end: read what it said
        status, body = _read_response(sock)
    return Upload(status, body, time.perf_counter() - start, sent)


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while True:
            head, blank, body = data.partition(b"\r\n\r\n")
            if blank:
                length = re.search(rb"(?im)^content-length: *(\d+)", head)
                if length is not None and len(body) >= int(length.group(1)):
                    break
                if length is None and body.endswith(b"0\r\n\r\n"):
                    break
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    if not data.startswith(b"HTTP/1."):
        return 0, data
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


class RssWatch:
    """The peak resident memory of process ``pid`` while the block runs, in bytes, against
    what it held when the block began."""

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.process = psutil.Process(pid)
        self.interval = interval
        self.base = 0
        self.peak = 0
        self.samples = 0
        self._hwm_reset = False  # the kernel's high-water mark counts from our start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @property
    def rise(self) -> int:
        return self.peak - self.base

    def __enter__(self) -> RssWatch:
        self._reset_high_water_mark()
        self.base = self.peak = self.process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._high_water_mark())

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.process.memory_info().rss)
                self.samples += 1

    def _reset_high_water_mark(self) -> None:
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")
            self._hwm_reset = True

    def _high_water_mark(self) -> int:
        """``VmHWM`` (kB) if it was reset when the block began, else 0."""
        if not self._hwm_reset:
            return 0
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0


@dataclass
class ServerProcess:
    """``python -m ollamatrio serve`` on 127.0.0.1 (a free port), simulated engine."""

    proc: subprocess.Popen[bytes]
    address: tuple[str, int]
    models: Path
    log: list[bytes] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    def blob_files(self) -> list[str]:
        """Every file in the store's blobs folder, temporary ones included."""
        return sorted(os.listdir(self.models / "blobs"))


def _load_the_app(address: tuple[str, int]) -> None:
    """One request the app answers (``/api/tags``): the server imports its app at the first
    such request, and what callers measure is what they send, not that import."""
    connection = http.client.HTTPConnection(*address, timeout=60)
    try:
        connection.request("GET", "/api/tags")
        connection.getresponse().read()
    finally:
        connection.close()


@contextlib.contextmanager
def server_process(
    models: Path, env: Mapping[str, str] | None = None, *, disk_rate: float | None = None,
    start_timeout: float = 60.0,
) -> Iterator[ServerProcess]:  # fmt: skip
    """A server on a free loopback port over the store at ``models``, stopped (SIGTERM,
    then SIGKILL) when the block ends.  Its log is kept in ``log``.  With ``disk_rate`` its
    store writes blobs at that many bytes a second at most."""
    environment = {
        **os.environ, "OLLAMA_HOST": "127.0.0.1:0", "OLLAMA_MODELS": str(models),
        "OLLAMATRIO_ENGINE": "simulated", "OLLAMATRIO_SIMULATED_GPUS": _SIMULATED_SYSTEM,
        **(env or {}),
    }  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "ollamatrio", "serve"] if disk_rate is None
        else [sys.executable, "-c", _SLOW_DISK_SERVER, str(disk_rate)],
        env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        # Not the caller's folder: ``-m`` puts the working folder first on the path, which
        # would shadow a PYTHONPATH pointing at another tree.
        cwd=models.parent,
    )  # fmt: skip
    assert proc.stderr is not None
    log: list[bytes] = []
    drain: threading.Thread | None = None
    try:
        # The start-up lines come first: read them here (bounded by the timer below, which
        # kills a server that never says where it listens), then drain the rest in a thread
        # so the server never blocks on a full pipe.
        timer = threading.Timer(start_timeout, proc.kill)
        timer.start()
        try:
            match = None
            while match is None:
                line = proc.stderr.readline()
                if not line:
                    raise RuntimeError("the server exited:\n" + b"".join(log).decode())
                log.append(line)
                match = _LISTENING.search(line)
        finally:
            timer.cancel()
        drain = threading.Thread(target=_drain, args=(proc.stderr, log), daemon=True)
        drain.start()
        address = (match.group(1).decode(), int(match.group(2)))
        _load_the_app(address)
        yield ServerProcess(proc, address, models, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if drain is not None:
            drain.join(timeout=5)  # EOF once the server is gone (its runners share no pipe)
        proc.stderr.close()


def _drain(stream: IO[bytes], log: list[bytes]) -> None:
    with contextlib.suppress(ValueError, OSError):
        for line in stream:
            log.append(line)
