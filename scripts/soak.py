#!/usr/bin/env python3
"""A seeded, bounded soak of a real server on loopback.

Starts its own ``python -m ollamatrio serve`` (real llama.cpp runner processes) on
127.0.0.1 with a fresh temporary store holding ``--models`` tiny generated chat models
(random weights: they produce garbage text fast) and ``--embed-models`` embedding models,
``OLLAMA_MAX_LOADED_MODELS=2`` and ``OLLAMA_NUM_PARALLEL=2`` by default, and a private
``TMPDIR`` so that runner folders left behind can be counted.  Then ``--clients``
concurrent clients send the seeded mix of ``ollamatrio.testing.soak``: native generate,
chat and embed, OpenAI chat and completions, streaming or not, random ``keep_alive`` and
``num_ctx``, mid-stream and early disconnects, ``/api/ps`` polls.

Bounded: ``--requests`` in all and ``--max-seconds`` of wall time; every request has
``--timeout`` seconds, and one that runs out is counted as a hang.  After the traffic the
script watches the models whose keep-alive runs out within ``--expiry-wait`` seconds (one
listed more than 3 s past its ``expires_at`` is "overdue"), then stops the server with
SIGTERM.

Prints requests ok / 4xx / 5xx (with the distinct messages) / in-stream errors /
transport errors / timeouts per endpoint, p50/p99 latency of completed requests, the
server's RSS and open fds before and after (and the RSS growth per request over each half
of the run), runner processes left after shutdown, and ``ollamatrio-runner-*`` folders left
in the temp directory.  Exits 1 on any hang, undesigned 5xx (anything but 503 "server
busy"), in-stream error, transport error, overdue expiry, leaked runner or leftover folder.

``--hostile N`` runs N raw-socket hostile clients beside the normal ones for as long as they
run (``ollamatrio.testing.hostile``: stalled bodies, half-closes, HTTP/1.0 streams, HTTP/2
prefaces and h2c upgrades, duplicate and malformed ``Host`` headers, wrong-digest uploads),
with the server's body-read timeout at ``--body-timeout``; every probe must be answered as
designed, and the normal clients' counts stay as above.

``--tracemalloc N`` runs the server under ``tracemalloc`` (N frames) and writes snapshots
after 0 %, 50 % and 100 % of the requests; the script prints the allocation sites that grew
most in each half.  For finding a leak only: tracing slows the server, and taking a snapshot
stops it for seconds, so latencies and hang counts of such a run mean nothing.

    .venv/bin/python scripts/soak.py --requests 5000 --clients 16 --seed 1
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import trio

from ollamatrio.store import ModelStore, import_gguf
from ollamatrio.testing import write_tiny_gguf
from ollamatrio.testing.hostile import Hostile, run_hostile
from ollamatrio.testing.soak import (
    MIX,
    OUTCOMES,
    Result,
    Soak,
    error_message,
    percentile,
    run_clients,
)

OVERDUE_GRACE = 3.0  # seconds a model may stay listed past its expires_at
BODY_TIMEOUT_ENV = "OLLAMATRIO_BODY_TIMEOUT"


@dataclass
class Sample:
    done: int  # requests finished
    rss: int
    fds: int


@dataclass
class Watch:
    """The server process as the script sees it."""

    proc: psutil.Process
    snapshots: Path | None  # tracemalloc snapshot folder, or None
    samples: list[Sample] = field(default_factory=list)
    runners: dict[int, float] = field(default_factory=dict)  # pid -> create_time

    def measure(self) -> tuple[int, int]:
        return self.proc.memory_info().rss, self.proc.num_fds()

    def note_children(self) -> None:
        with contextlib.suppress(psutil.Error):
            for child in self.proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.runners.setdefault(child.pid, child.create_time())

    async def snapshot(self, label: str) -> None:
        if self.snapshots is None:
            return
        target = self.snapshots / f"{label}.snap"
        self.proc.send_signal(signal.SIGUSR1)
        # Another process writes the file: nothing to wait on but the file system.
        with trio.move_on_after(120):
            while not target.exists():  # noqa: ASYNC110
                await trio.sleep(0.5)


# -- the server ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_store(root: Path, count: int, embed_count: int, seed: int) -> tuple[list[str], list[str]]:
    """Import ``count`` chat models and ``embed_count`` embedding models; their names."""
    store = ModelStore(root / "models")
    chat, embed = [], []
    for i in range(count + embed_count):
        is_embed = i >= count
        name = f"soak-embed-{i - count}" if is_embed else f"soak-{i}"
        extra: dict[str, Any] = {"pooling": "mean", "chat_template": None} if is_embed else {}
        path = write_tiny_gguf(root / f"{name}.gguf", seed=seed + i, name=name, **extra)
        for _ in import_gguf(store, name, path):
            pass
        path.unlink()
        (embed if is_embed else chat).append(name)
    return chat, embed


def server_env(args: argparse.Namespace, root: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OLLAMA", "OLLAMATRIO"))}
    env.update(
        OLLAMA_HOST=f"127.0.0.1:{port}",
        OLLAMA_MODELS=str(root / "models"),
        OLLAMA_MAX_LOADED_MODELS=str(args.max_loaded),
        OLLAMA_NUM_PARALLEL=str(args.num_parallel),
        TMPDIR=str(root / "tmp"),
    )
    if args.hostile:
        env[BODY_TIMEOUT_ENV] = f"{args.body_timeout:g}s"
    for item in args.server_env:
        key, _, value = item.partition("=")
        env[key] = value
    return env


def server_command(args: argparse.Namespace, root: Path) -> list[str]:
    if not args.tracemalloc:
        return [sys.executable, "-m", "ollamatrio", "serve"]
    return [sys.executable, __file__, "--traced-server", str(root / "snapshots"),
            "--tracemalloc", str(args.tracemalloc)]  # fmt: skip


def traced_server(folder: str, frames: int) -> None:
    """The server process of ``--tracemalloc``: SIGUSR1 writes a numbered snapshot."""
    import tracemalloc

    from ollamatrio.serve import run_server

    tracemalloc.start(frames)
    names = iter(["start", "half", "end"] + [f"extra-{i}" for i in range(100)])

    def dump(signum: int, frame: Any) -> None:
        snap = tracemalloc.take_snapshot()
        path = Path(folder) / f"{next(names)}.snap"
        snap.dump(str(path) + ".tmp")
        os.replace(str(path) + ".tmp", path)

    Path(folder).mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGUSR1, dump)
    run_server()


def wait_ready(url: str, proc: subprocess.Popen[bytes], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with status {proc.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/api/version", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"server not ready after {seconds:.0f} s")


# -- while the clients run -------------------------------------------------------------


async def monitor(soak: Soak, watch: Watch, interval: float) -> None:
    """Sample the server's RSS and fds, and remember every runner process it starts."""
    half_taken = False
    while True:
        watch.note_children()
        with contextlib.suppress(psutil.Error):
            rss, fds = watch.measure()
            watch.samples.append(Sample(len(soak.results), rss, fds))
        if not half_taken and len(soak.results) >= soak.requests / 2:
            half_taken = True
            await watch.snapshot("half")
        await trio.sleep(interval)


async def progress(soak: Soak, watch: Watch, every: float) -> None:
    while True:
        await trio.sleep(every)
        counts = Counter(r.outcome for r in soak.results)
        rss = watch.samples[-1].rss / 2**20 if watch.samples else 0.0
        print(f"  {len(soak.results)}/{soak.requests} done, {dict(counts)}, "
              f"rss {rss:.1f} MiB", flush=True)  # fmt: skip


async def check_expiry(url: str, wait: float) -> tuple[list[str], list[str]]:
    """Poll /api/ps until no listed model expires within ``wait`` seconds.  Returns the
    models seen listed past their expires_at (+ grace), and the /api/ps errors."""
    overdue: set[str] = set()
    errors: list[str] = []
    end = time.time() + wait
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while time.time() < end:
            r = await client.get("/api/ps")
            if r.status_code != 200:
                errors.append(f"{r.status_code} {error_message(r.text)}")
                await trio.sleep(0.5)
                continue
            now = time.time()
            expiring = False
            for m in r.json()["models"]:
                at = datetime.fromisoformat(m["expires_at"].replace("Z", "+00:00")).timestamp()
                if at < now - OVERDUE_GRACE:
                    overdue.add(f"{m['name']} ({now - at:.1f} s past expires_at)")
                expiring = expiring or at < end
            if not expiring:
                break
            await trio.sleep(0.5)
    return sorted(overdue), errors


async def drive(
    soak: Soak, watch: Watch, args: argparse.Namespace, hostile: Hostile | None
) -> tuple[list[str], ...]:
    await watch.snapshot("start")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(monitor, soak, watch, 0.5)
        nursery.start_soon(progress, soak, watch, args.progress)
        if hostile is None:
            await run_clients(soak)
        else:
            # Hostile clients run for as long as the normal ones; their probes in flight
            # then finish (each is bounded) before the expiry watch.
            stop = trio.Event()
            async with trio.open_nursery() as traffic:
                traffic.start_soon(
                    run_hostile, hostile, args.hostile, args.seed, stop, args.requests
                )
                await run_clients(soak)
                stop.set()
        try:
            result = await check_expiry(soak.url, args.expiry_wait)
        except httpx.TransportError as exc:
            result = ([], [f"{type(exc).__name__}: {exc}"])
        nursery.cancel_scope.cancel()
    await watch.snapshot("end")
    return result


# -- report ----------------------------------------------------------------------------


def growth(samples: list[Sample]) -> tuple[float, float]:
    """RSS growth in bytes per request (least squares) over each half of the requests."""
    if not samples:
        return float("nan"), float("nan")
    total = samples[-1].done

    def slope(part: list[Sample]) -> float:
        xs = [s.done for s in part]
        if len(part) < 3 or xs[-1] == xs[0]:
            return float("nan")
        ys = [s.rss for s in part]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        den = sum((x - mx) ** 2 for x in xs)
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den

    first = [s for s in samples if 0 < s.done <= total / 2]
    second = [s for s in samples if s.done >= total / 2]
    return slope(first), slope(second)


def print_table(results: list[Result]) -> None:
    rows: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        rows[r.endpoint].append(r)
    print("| endpoint | requests | " + " | ".join(OUTCOMES) + " | p50 s | p99 s | max s |")
    print("|---|" + "---|" * (len(OUTCOMES) + 4))
    for endpoint in [e for e, _ in MIX] + ["all"]:
        rs = results if endpoint == "all" else rows.get(endpoint, [])
        counts = Counter(r.outcome for r in rs)
        lat = [r.latency for r in rs if r.outcome == "ok"]
        cells = " | ".join(str(counts.get(o, 0)) for o in OUTCOMES)
        p50, p99, top = percentile(lat, 0.5), percentile(lat, 0.99), max(lat, default=math.nan)
        print(f"| {endpoint} | {len(rs)} | {cells} | {p50:.3f} | {p99:.3f} | {top:.3f} |")


def print_tracemalloc(folder: Path, top: int = 15) -> None:
    import tracemalloc

    snaps = [folder / f"{n}.snap" for n in ("start", "half", "end")]
    if not all(p.exists() for p in snaps):
        print(f"tracemalloc: snapshots missing in {folder}")
        return
    loaded = [tracemalloc.Snapshot.load(str(p)) for p in snaps]
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    loaded = [s.filter_traces(ignore) for s in loaded]
    for (a, b), label in (((0, 1), "start -> half"), ((1, 2), "half -> end")):
        stats = loaded[b].compare_to(loaded[a], "traceback")
        total = sum(s.size_diff for s in stats)
        print(f"\ntracemalloc {label}: {total / 2**10:+.0f} KiB traced; top sites:")
        for stat in stats[:top]:
            frames = list(stat.traceback)[::-1][:4]  # most recent first
            where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames)
            print(f"  {stat.size_diff / 2**10:+8.1f} KiB {stat.count_diff:+6d} blocks  {where}")


def print_hostile(hostile: Hostile) -> int:
    """The hostile probes by kind; returns how many were not answered as designed."""
    by_kind: dict[str, list[Any]] = defaultdict(list)
    for probe in hostile.probes:
        by_kind[probe.kind].append(probe)
    print("\nhostile probes: kind, count, as designed, answers seen, p50 / max seconds")
    bad = 0
    for kind in sorted(by_kind):
        probes = by_kind[kind]
        good = sum(p.as_designed for p in probes)
        bad += len(probes) - good
        seen = Counter(p.seen for p in probes).most_common(4)
        times = sorted(p.seconds for p in probes)
        print(f"  {kind:16} {len(probes):5} {good:5}  {dict(seen)}  "
              f"{percentile(times, 0.5):.2f} / {times[-1]:.2f}")  # fmt: skip
    return bad


def report(soak: Soak, watch: Watch, extra: dict[str, Any], hostile: Hostile | None) -> bool:
    print()
    print_table(soak.results)
    hostile_bad = print_hostile(hostile) if hostile is not None else 0
    for label, kind in (("5xx", "5xx"), ("4xx", "4xx"), ("in-stream errors", "stream_error"),
                        ("transport errors", "transport")):  # fmt: skip
        messages = Counter((r.status, r.message) for r in soak.results if r.outcome == kind)
        if messages:
            print(f"\ndistinct {label}:")
            for (status, message), n in messages.most_common(20):
                print(f"  {n} x {status} {message}")
    hangs = [r for r in soak.results if r.outcome == "timeout"]
    if hangs:
        print("\nhangs:")
        for r in hangs:
            print(f"  {r.endpoint} model={r.model} stream={r.stream} keep_alive={r.keep_alive!r}")
    print()
    for key, value in extra.items():
        print(f"{key}: {value}")
    first, second = growth(watch.samples)
    print(f"RSS growth per request: first half {first:.0f} B, second half {second:.0f} B")
    if watch.snapshots is not None:
        print_tracemalloc(watch.snapshots)
    failures = {
        "hangs": len(hangs),
        "undesigned 5xx": len(soak.undesigned_5xx()),
        "in-stream errors": soak.count("stream_error"),
        "transport errors": soak.count("transport"),
        "overdue expiries": len(extra["overdue expiries"]),
        "/api/ps errors after the run": len(extra["/api/ps errors after the run"]),
        "leaked runners": len(extra["leaked runner processes"]),
        "leftover folders": len(extra["leftover runner folders"]),
        "server killed": int(extra["server stop"] != "SIGTERM"),
        "hostile probes not answered as designed": hostile_bad,
    }
    bad = {k: v for k, v in failures.items() if v}
    print("RESULT:", "PASS" if not bad else f"FAIL {bad}")
    return not bad


# -- main ------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1000, help="requests in all (default 1000)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--models", type=int, default=4, help="chat models (default 4)")
    p.add_argument(
        "--embed-models",
        type=int,
        default=1,
        help="embedding models, the only ones /api/embed asks (default 1)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-seconds", type=float, default=1800.0, help="wall-time cap on traffic")
    p.add_argument("--timeout", type=float, default=60.0, help="per request; past it: a hang")
    p.add_argument(
        "--disconnects",
        type=float,
        default=0.2,
        help="fraction of streaming requests that leave after 1-3 lines",
    )
    p.add_argument(
        "--early-disconnects",
        type=float,
        default=0.03,
        help="fraction of requests that leave after 0.01-1 s",
    )
    p.add_argument("--max-loaded", type=int, default=2)
    p.add_argument("--num-parallel", type=int, default=2)
    p.add_argument(
        "--expiry-wait",
        type=float,
        default=15.0,
        help="after the traffic, seconds to watch short keep-alives expire",
    )
    p.add_argument("--progress", type=float, default=30.0, help="seconds between progress lines")
    p.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the server (repeatable)",
    )
    p.add_argument(
        "--tracemalloc",
        type=int,
        default=0,
        metavar="FRAMES",
        help="trace the server's allocations and print the sites that grew",
    )
    p.add_argument(
        "--hostile",
        type=int,
        default=0,
        metavar="WORKERS",
        help="raw-socket hostile clients beside the normal ones (ollamatrio.testing.hostile)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=3.0,
        help="the server's body-read timeout with --hostile (seconds; slow bodies wait it out)",
    )
    p.add_argument(
        "--upload-mib", type=int, default=32, help="size of the hostile wrong-digest upload"
    )
    p.add_argument("--traced-server", metavar="FOLDER", help=argparse.SUPPRESS)
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    return p.parse_args()  # fmt: skip


def stop_server(proc: subprocess.Popen[bytes]) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
        return "SIGTERM"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
        return "SIGKILL after 60 s"


def leaked_runners(watch: Watch) -> list[str]:
    """Runner processes still alive after the server exited (killed here: they are ours)."""
    leaked = []
    for pid, created in watch.runners.items():
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            if p.create_time() == created:
                leaked.append(f"{pid} {' '.join(p.cmdline())[:80]}")
                p.kill()
    return leaked


def main() -> int:
    args = parse_args()
    if args.traced_server:
        traced_server(args.traced_server, args.tracemalloc)
        return 0
    root = Path(tempfile.mkdtemp(prefix="ollamatrio-soak-"))
    (root / "tmp").mkdir()
    print(f"soak: {args.requests} requests, {args.clients} clients, {args.models} chat + "
          f"{args.embed_models} embedding models, seed {args.seed}, "
          f"max {args.max_seconds:.0f} s, timeout {args.timeout:.0f} s; dir {root}",
          flush=True)  # fmt: skip
    models, embed_models = make_store(root, args.models, args.embed_models, args.seed)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = root / "server.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            server_command(args, root),
            env=server_env(args, root, port),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
    ok = False
    try:
        wait_ready(url, proc)
        watch = Watch(psutil.Process(proc.pid), root / "snapshots" if args.tracemalloc else None)
        rss0, fds0 = watch.measure()
        soak = Soak(
            url, models, embed_models, args.requests, clients=args.clients, seed=args.seed,
            timeout=args.timeout, max_seconds=args.max_seconds, disconnects=args.disconnects,
            early_disconnects=args.early_disconnects,
            on_hang=lambda r: print(f"  hang: {r.endpoint} model={r.model} stream={r.stream} "
                                    f"keep_alive={r.keep_alive!r}", flush=True),
        )  # fmt: skip
        hostile = None
        if args.hostile:
            hostile = Hostile("127.0.0.1", port, models[0], args.body_timeout,
                              upload_bytes=args.upload_mib << 20)  # fmt: skip
        started = time.monotonic()
        overdue, ps_errors = trio.run(drive, soak, watch, args, hostile)
        elapsed = time.monotonic() - started
        if proc.poll() is not None:
            raise SystemExit(f"the server exited during the run (status {proc.returncode})")
        rss1, fds1 = watch.measure()
        watch.note_children()
        stop = stop_server(proc)
        time.sleep(0.5)
        leaked = leaked_runners(watch)
        leftovers = sorted(p.name for p in (root / "tmp").glob("ollamatrio-runner-*"))
        log_text = log_path.read_text(errors="replace")
        extra = {
            "wall time": f"{elapsed:.0f} s ({len(soak.results) / elapsed:.1f} requests/s)",
            "runner processes started": len(watch.runners),
            "server RSS before / after": f"{rss0 / 2**20:.1f} / {rss1 / 2**20:.1f} MiB",
            "server fds before / after": f"{fds0} / {fds1}",
            "server stop": stop,
            "leaked runner processes": leaked,
            "leftover runner folders": leftovers,
            "overdue expiries": overdue,
            "/api/ps errors after the run": ps_errors,
            "tracebacks in the server log": log_text.count("Traceback"),
        }
        ok = report(soak, watch, extra, hostile)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if args.keep or not ok:
            print(f"kept {root} (server log: {log_path})")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
