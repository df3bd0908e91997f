"""The reference Ollama for side-by-side benchmarks (``--against-ollama``).

The upstream server, release 0.24 built for this machine kind, lies as a tarball in
``../shared/ollama/`` beside the checkout (or where ``--ollama-tarball`` says).  It is
unpacked into a temporary folder and served from there with a store of its own; a model is
created in that store from the same GGUF and Modelfile text the ollamatrio side imports, with
Ollama's own ``ollama create``.  Never a dependency of ollamatrio: only these scripts use it.

Also here, because both sides need them alike: the CPU time and resident memory of a server's
whole process tree (its runners included), and the time from starting a server to its first
answer.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import psutil
import trio

REPO = Path(__file__).resolve().parent.parent
TARBALL_NAME = "ollama-0.24.0-linux-amd64-cpu.tgz"


def find_tarball(given: Path | None = None) -> Path:
    """``given``, else ``shared/ollama/<tarball>`` in the checkout's parent folder or the one
    above it (a worktree sits one level deeper than the main checkout)."""
    if given is not None:
        candidates = [given]
    else:
        candidates = [d / "shared" / "ollama" / TARBALL_NAME for d in REPO.parents[:2]]
    for path in candidates:
        if path.is_file():
            return path
    raise SystemExit(f"no reference Ollama: looked for {', '.join(map(str, candidates))}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Ollama:
    url: str
    pid: int
    binary: Path
    started_in: float  # seconds from starting the process to its first answer
    home: Path

    async def create(self, name: str, modelfile: str) -> None:
        """``ollama create name`` from Modelfile text (``FROM`` an absolute GGUF path)."""
        path = self.home / f"{name.replace(':', '_')}.Modelfile"
        path.write_text(modelfile)
        host = self.url.removeprefix("http://")
        await trio.run_process(
            [str(self.binary), "create", name, "-f", str(path)],
            env=dict(os.environ, OLLAMA_HOST=host, HOME=str(self.home)),
            capture_stdout=True,
            capture_stderr=True,
        )


async def wait_answering(
    url: str, since: float, limit: float = 60.0, verify: ssl.SSLContext | bool = True
) -> float:
    """Seconds from ``since`` (``time.perf_counter``) until ``GET /api/version`` answers
    (``verify``: the authorities an ``https://`` server is checked against)."""
    async with httpx.AsyncClient(base_url=url, verify=verify) as probe:
        with trio.fail_after(limit):
            while True:
                try:
                    (await probe.get("/api/version")).raise_for_status()
                    return time.perf_counter() - since
                except httpx.TransportError:
                    await trio.sleep(0.01)


@asynccontextmanager
async def running_ollama(
    tarball: Path, port: int, env: dict[str, str] | None = None
) -> AsyncIterator[Ollama]:
    """Unpack and serve the reference Ollama on 127.0.0.1:``port`` for the block."""
    with tempfile.TemporaryDirectory(prefix="ollama-ref-") as tmp:
        home = Path(tmp)
        await trio.to_thread.run_sync(_unpack, tarball, home / "ollama")
        binary = home / "ollama" / "bin" / "ollama"
        url = f"http://127.0.0.1:{port}"
        full_env = dict(
            os.environ,
            OLLAMA_HOST=f"127.0.0.1:{port}",
            OLLAMA_MODELS=str(home / "models"),
            HOME=str(home),
            **(env or {}),
        )
        # Its log, for when it will not start: in the temporary folder, gone with it.
        log = await trio.to_thread.run_sync(partial(open, home / "serve.log", "wb"))
        with log:
            started = time.perf_counter()
            process = await trio.lowlevel.open_process(
                [str(binary), "serve"], env=full_env, stdout=log, stderr=subprocess.STDOUT
            )
            try:
                started_in = await wait_answering(url, started)
                yield Ollama(url, process.pid, binary, started_in, home)
            finally:
                with trio.CancelScope(shield=True):
                    process.terminate()
                    with trio.move_on_after(30):
                        await process.wait()
                    process.kill()


def _unpack(tarball: Path, into: Path) -> None:
    into.mkdir()
    with tarfile.open(tarball) as archive:
        archive.extractall(into, filter="data")


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and its live descendants.
    Only differences between two readings mean anything, and only while no child came or
    went in between (the runners of these benchmarks stay loaded)."""
    total = 0.0
    for p in tree(pid):
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants."""
    total = 0
    for p in tree(pid):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total
