"""Concurrent create, copy and delete of the same few names against a running server.

``run_race`` drives ``threads`` clients over plain sockets (one request per connection,
``Connection: close``), each drawing its operations from its own seeded ``random.Random``:
create a name from the base model or from another name (a random system prompt and
temperature, so most creates write new blobs), copy one name over another, delete a name.
``store_audit`` then reads the store's folder and reports the blobs no manifest references
(orphans) and the blobs manifests name that are missing.  ``scripts/store_race.py`` and
``tests/test_hostile_store.py`` run it.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store.manifest import Manifest, StoreError

NAMES = ("race-a", "race-b", "race-c")
_READ_LIMIT = 1 << 20  # every answer here is a small JSON object


@dataclass
class RaceResult:
    statuses: Counter[int] = field(default_factory=Counter)
    operations: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)  # bodies of 5xx answers

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


@dataclass(frozen=True)
class StoreAudit:
    manifests: int
    blobs: int
    orphans: tuple[str, ...]  # blob files no manifest references
    missing: tuple[str, ...]  # digests a manifest references that have no blob file


def http_request(
    host: str,
    port: int,
    method: str,
    path: str,
    body: Any = None,
    timeout: float = 30.0,
    *,
    data: bytes | None = None,
) -> tuple[int, bytes]:
    """One request on its own connection (``body`` as JSON, or ``data`` as it is); the
    status and the raw rest of the answer."""
    payload = data if data is not None else json.dumps(body).encode() if body is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(head + payload)
        answer = bytearray()
        while len(answer) < _READ_LIMIT and (data := sock.recv(65536)):
            answer += data
    status_line, _, rest = bytes(answer).partition(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ConnectionError(f"no HTTP answer: {bytes(answer[:80])!r}")
    return int(parts[1]), rest


def _operation(rng: random.Random, base: str, names: tuple[str, ...]) -> tuple[str, str, Any]:
    kind = rng.choice(("create", "create", "copy", "delete"))
    if kind == "create":
        body = {
            "model": rng.choice(names),
            "from": rng.choice((base, *names)),
            "system": f"system prompt {rng.randrange(1000)}",
            "parameters": {"temperature": rng.randrange(100) / 100},
            "stream": False,
        }
        return kind, "/api/create", body
    if kind == "copy":
        return (
            kind,
            "/api/copy",
            {"source": rng.choice((base, *names)), "destination": rng.choice(names)},
        )
    return kind, "/api/delete", {"model": rng.choice(names)}


def run_race(
    host: str,
    port: int,
    base: str,
    *,
    threads: int = 8,
    operations: int | None = None,
    seconds: float | None = None,
    seed: int = 0,
    names: tuple[str, ...] = NAMES,
) -> RaceResult:
    """``threads`` clients, each until it sent ``operations`` requests or ``seconds`` passed
    (at least one of the two must be given: every loop here is bounded)."""
    if operations is None and seconds is None:
        raise ValueError("give operations, seconds or both")
    result = RaceResult()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds if seconds is not None else None

    def client(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        sent = 0
        while (operations is None or sent < operations) and (
            deadline is None or time.monotonic() < deadline
        ):
            kind, path, body = _operation(rng, base, names)
            method = "DELETE" if kind == "delete" else "POST"
            status, answer = http_request(host, port, method, path, body)
            sent += 1
            with lock:
                result.statuses[status] += 1
                result.operations[kind] += 1
                if status >= 500:
                    result.errors.append(answer[-300:].decode(errors="replace"))

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return result


def store_audit(models_dir: Path) -> StoreAudit:
    """What the store's folder holds once nothing writes it: orphans and missing blobs."""
    referenced: set[str] = set()
    manifests = 0
    for path in (models_dir / "manifests").rglob("*"):
        if path.is_file() and not path.name.startswith("."):
            try:
                referenced |= Manifest.parse(path.read_bytes()).digests()
            except StoreError:
                continue
            manifests += 1
    present = {
        "sha256:" + p.name.removeprefix("sha256-")
        for p in (models_dir / "blobs").iterdir()
        if p.name.startswith("sha256-") and "partial" not in p.name
    }
    return StoreAudit(
        manifests=manifests,
        blobs=len(present),
        orphans=tuple(sorted(present - referenced)),
        missing=tuple(sorted(referenced - present)),
    )
