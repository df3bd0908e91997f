#!/usr/bin/env python3
"""Idle client connections against the server's open file limit, on loopback.

For each scenario ``SOFT:HARD:IDLE`` the script starts ``python -m ollamatrio serve``
(real llama.cpp runners) under ``ulimit -Hn HARD; ulimit -Sn SOFT`` with a fresh temporary
store holding one tiny generated chat model, opens ``IDLE`` client connections that send
nothing, then times a new ``GET /api/version`` and a ``POST /api/generate`` that loads the
model (a runner process starts), and stops the server with SIGTERM.

Prints one row per scenario: the server's open file limit (its soft limit as
``/proc/PID/limits`` shows it), the connection cap it logged, the idle connections opened
(a connect that takes over ``--connect-timeout`` seconds ends the opening: the server no
longer accepts), the server's open descriptors then, the two requests' status and time
(``timeout`` after ``--timeout`` seconds), and how many of the idle connections the server
had closed by then.

Bounded: at most ``IDLE`` connects per scenario, each request ``--timeout`` seconds, the
server ``--start-timeout`` seconds to start.  ``--pythonpath DIR`` runs the server from
another checkout (for a before/after comparison).  Linux only (``/proc``).

    .venv/bin/python scripts/bench_connections.py 1024:1024:1100 1024:20000:1100
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ollamatrio.store import ModelStore, import_gguf
from ollamatrio.testing import write_tiny_gguf

LISTENING = re.compile(rb"Listening on (http://\S+)")
CAP = re.compile(rb"up to (\d+) client connections")


@dataclass
class Row:
    scenario: str
    limit: str = "?"
    cap: str = "-"
    opened: int = 0
    fds: int = 0
    version: str = "-"
    generate: str = "-"
    closed: int = 0


def request(host: str, port: int, raw: bytes, timeout: float) -> str:
    """Send ``raw`` on a new connection; "STATUS in N ms", or why not."""
    start = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(raw)
            data = b""
            deadline = start + timeout
            while b"\r\n\r\n" not in data or not response_complete(data):
                sock.settimeout(max(0.001, deadline - time.perf_counter()))
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except TimeoutError:
        return f"timeout ({timeout:g} s)"
    except OSError as exc:
        return type(exc).__name__
    ms = (time.perf_counter() - start) * 1000
    status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "no answer"
    return f"{status} in {ms:.0f} ms"


def response_complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    match = re.search(rb"(?i)content-length: *(\d+)", head)
    return match is not None and len(body) >= int(match.group(1))


def server_limit(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return f"{soft}/{hard}"
    return "?"


def run_scenario(spec: str, root: Path, args: argparse.Namespace) -> Row:
    soft, hard, idle = (int(x) for x in spec.split(":"))
    row = Row(f"ulimit {soft}/{hard}, {idle} idle")
    env = dict(os.environ, OLLAMA_HOST="127.0.0.1:0", OLLAMA_MODELS=str(root / "models"))
    env["PYTHONPATH"] = args.pythonpath or str(Path(__file__).resolve().parent.parent)
    log_path = root / f"server-{soft}-{hard}-{idle}.log"
    command = f'ulimit -Sn {soft} && ulimit -Hn {hard} && exec "$@"'  # soft <= hard
    argv = ["bash", "-c", command, "bash", sys.executable, "-m", "ollamatrio", "serve"]
    sockets: list[socket.socket] = []
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(argv, cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + args.start_timeout
        while (match := LISTENING.search(log_path.read_bytes())) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{log_path.read_text()}")
            time.sleep(0.05)
        host, port = match.group(1).decode().removeprefix("http://").rsplit(":", 1)
        if cap := CAP.search(log_path.read_bytes()):
            row.cap = cap.group(1).decode()
        row.limit = server_limit(proc.pid)
        for _ in range(idle):
            sock = socket.socket()
            sock.settimeout(args.connect_timeout)
            try:
                sock.connect((host, int(port)))
            except OSError:
                sock.close()
                break
            sockets.append(sock)
        row.opened = len(sockets)
        time.sleep(1.0)  # the server accepts what is in its backlog
        row.fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        row.version = request(
            host, int(port), b"GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", args.timeout
        )
        body = json.dumps(
            {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 4}}
        ).encode()
        row.generate = request(
            host,
            int(port),
            b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body),
            args.timeout,
        )
        for sock in sockets:
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                row.closed += sock.recv(1) == b""
    finally:
        for sock in sockets:
            sock.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", default=["1024:1024:1100"])
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--connect-timeout", type=float, default=5.0)
    parser.add_argument("--start-timeout", type=float, default=60.0)
    parser.add_argument("--pythonpath", default="", help="run the server from this checkout")
    args = parser.parse_args()
    # This process holds the idle connections: its own soft limit goes to the hard one.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    root = Path(tempfile.mkdtemp(prefix="bench-connections-"))
    try:
        store = ModelStore(root / "models")
        for _ in import_gguf(store, "tiny", write_tiny_gguf(root / "tiny.gguf")):
            pass
        rows = [run_scenario(spec, root, args) for spec in args.scenarios]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    header = ("scenario", "server limit", "cap", "opened", "server fds", "/api/version",
              "generate (load)", "idle closed")  # fmt: skip
    table = [header]
    for r in rows:
        counts = (str(r.opened), str(r.fds))
        table.append((r.scenario, r.limit, r.cap, *counts, r.version, r.generate, str(r.closed)))
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for n, line in enumerate(table):
        print(" | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
        if n == 0:
            print("-+-".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
