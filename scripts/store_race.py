#!/usr/bin/env python3
"""Concurrent create, copy and delete of the same names against a real server.

Starts its own ``python -m ollamatrio serve`` on 127.0.0.1 with a fresh temporary store
holding one tiny generated model (``race-base``), runs ``ollamatrio.testing.store_race``'s
clients (``--threads`` threads, for ``--seconds`` or ``--operations`` each) creating,
copying and deleting three names, stops the server with SIGTERM and audits the store's
folder: blob files no manifest references (orphans) and blobs a manifest names that are
missing.  Exits 1 on any 5xx, orphan or missing blob.  ``--pythonpath`` runs the server
from another tree (the clients and the audit stay this tree's).

    .venv/bin/python scripts/store_race.py --threads 8 --seconds 40
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ollamatrio.store import ModelStore, import_gguf
from ollamatrio.testing import write_tiny_gguf
from ollamatrio.testing.store_race import http_request, run_race, store_audit

BASE = "race-base"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: subprocess.Popen[bytes], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with status {proc.returncode} before it was ready")
        try:
            if http_request("127.0.0.1", port, "GET", "/api/version", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"server not ready after {seconds:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--operations", type=int, default=None, help="per thread")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--pythonpath", help="PYTHONPATH of the server (another tree, e.g. from git archive)"
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="ollamatrio-store-race-"))
    models = root / "models"
    gguf = write_tiny_gguf(root / "base.gguf", seed=args.seed)
    for _ in import_gguf(ModelStore(models), BASE, gguf):
        pass
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA", "OLLAMATRIO"))}
    env.update(OLLAMA_HOST=f"127.0.0.1:{port}", OLLAMA_MODELS=str(models))
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    with open(root / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ollamatrio", "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
    try:
        wait_ready(port, proc)
        started = time.monotonic()
        result = run_race(
            "127.0.0.1",
            port,
            BASE,
            threads=args.threads,
            operations=args.operations,
            seconds=args.seconds,
            seed=args.seed,
        )
        elapsed = time.monotonic() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    audit = store_audit(models)
    total = sum(result.operations.values())
    print(
        f"{total} operations in {elapsed:.1f} s ({dict(result.operations)}), "
        f"statuses {dict(sorted(result.statuses.items()))}"
    )
    for error in sorted(set(result.errors))[:10]:
        print(f"  5xx: {error!r}")
    print(
        f"store: {audit.manifests} manifests, {audit.blobs} blobs, "
        f"{len(audit.orphans)} orphans, {len(audit.missing)} missing"
    )
    if args.keep:
        print(f"kept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if result.server_errors or audit.orphans or audit.missing else 0


if __name__ == "__main__":
    sys.exit(main())
