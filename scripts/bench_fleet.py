#!/usr/bin/env python3
"""Benchmark the fleet gateway: what one hop through it costs a streamed token, and how many
model loads its routing saves over a model-blind one.

Two ``python -m ollamatrio serve`` hosts (the simulated engine, tokens paced at ``--rate``
a second, one shared store of tiny generated models) and ``python -m ollamatrio fleet
gateway`` in front of them, each its own process, so that the gateway's CPU time (``psutil``,
the gateway process alone) can be divided by the tokens it relayed.

* **Paced streams**: ``--streams`` concurrent ``/api/generate`` streams of ``--tokens``
  tokens each, straight to the host that holds the model, then through the gateway (which
  sends them to that same host), rounds alternating.  Columns: time to first token p50,
  inter-token gap p50/p99 (as the client sees the lines), the gateway's CPU µs per token,
  and the gateway's TTFT over direct (medians).
* **Mixed models**: ``--requests`` short requests over ``--models`` models from
  ``--clients`` concurrent clients (a seeded random sequence), each host holding at most
  ``--max-loaded`` models (``OLLAMA_MAX_LOADED_MODELS``): model loads on all hosts (from the
  hosts' ``ollamatrio_loads_total``) through the gateway (this policy) and round-robin
  straight to the hosts (model-blind, as Serve's default router, which picks the shorter
  of two random replicas' queues, is).

* **The floors**: the same number of paced streams over loopback TCP through the barest
  relays, their tokens written and read by another process (so that no GIL is shared with
  the relay): a Trio task per stream (per token one ``wait_readable``, one ``read``, one
  ``write``: what no relay on Trio's scheduler goes below) and a ``poll`` loop per stream in
  a thread (a relay off Trio's scheduler).

* **Serve's own proxy** (``--serve-proxy``, for the record): the same paced streams through
  Ray Serve's HTTP proxy to a Serve ingress deployment that forwards each request to the
  host holding the model (httpx, the answer streamed back as it comes), as a fleet built on
  Serve's data path would carry them.  Ray CPU per token is the CPU of Serve's proxy and
  ingress replica processes (``ray::ProxyActor``, ``ray::ServeReplica:*``) over the tokens.
  The whole benchmark then runs in a private network and PID namespace (``unshare -rn
  --pid``, as tests/test_fleet_ray.py: only ``lo``, so Ray keeps 127.0.0.1, and every
  process ends with it) on a one-node Ray cluster it starts and stops by PID (never ``ray
  stop``).  Needs the ``fleet`` extra; adds about 30 s of set-up.

    .venv/bin/python scripts/bench_fleet.py [--streams 8] [--rate 50] [--tokens 400]
        [--rounds 3] [--models 4] [--max-loaded 3] [--requests 48] [--clients 4]
        [--serve-proxy] [--baseline SOURCE_TREE]

``--baseline`` adds a second gateway started from another source tree (another commit's
checkout) in front of the same hosts, measured in the same rounds as ``baseline``: a
before/after comparison on one machine at one time.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing
import os
import random
import re
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import trio

from ollamatrio.store import ModelStore, import_gguf
from ollamatrio.testing import write_tiny_gguf

SYSTEM = json.dumps({"gpus": [], "system": {"total": 64 << 30, "cpu_count": 2}})
IN_NAMESPACE = "BENCH_FLEET_IN_NAMESPACE"  # set once the bench runs in its own namespace
UNSHARE = ["unshare", "-rn", "--pid", "--fork", "--mount-proc"]
SERVE_PROCESSES = ("ray::ProxyActor", "ray::ServeReplica")


@dataclass
class Round:
    ttfts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    relay_cpu: float = 0.0  # the gateway process, or Serve's proxy and ingress replica
    host_cpu: float = 0.0  # the host that serves the streams


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    args: list[str], env: dict[str, str], pattern: str, stdout: bool, cwd: str | None = None
) -> tuple[subprocess.Popen[str], str]:
    """A child process and the address it announces (``pattern`` on stdout or stderr);
    ``cwd``: where ``python -m`` finds the package first (another source tree)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ollamatrio", *args], env=env, text=True, cwd=cwd,
        stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL if stdout else subprocess.PIPE,
    )  # fmt: skip
    stream = proc.stdout if stdout else proc.stderr
    assert stream is not None
    for line in stream:
        if (match := re.search(pattern, line)) is not None:
            # Drained from now on: a full pipe would stop the child at its next log line.
            threading.Thread(target=stream.read, daemon=True).start()
            return proc, match.group(1)
    raise RuntimeError(f"{args} exited with {proc.wait()}")


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL if it has not ended after 30 s; reaped either way."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def stream(client: httpx.AsyncClient, url: str, body: dict[str, object], out: Round) -> None:
    sent = time.perf_counter()
    last = None
    async with client.stream("POST", f"{url}/api/generate", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line or not json.loads(line).get("response"):
                continue
            now = time.perf_counter()
            if last is None:
                out.ttfts.append(now - sent)
            else:
                out.gaps.append(now - last)
            last = now
            out.tokens += 1


async def paced_round(url: str, model: str, args: argparse.Namespace) -> Round:
    body = {"model": model, "prompt": "go", "options": {"num_predict": args.tokens}}
    out = Round()
    limits = httpx.Limits(max_connections=args.streams * 2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        async with trio.open_nursery() as nursery:
            for _ in range(args.streams):
                nursery.start_soon(stream, client, url, body, out)
    return out


def cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def loads(hosts: list[str]) -> float:
    """Successful model loads so far, over every host."""
    total = 0.0
    for url in hosts:
        for line in httpx.get(f"{url}/metrics").text.splitlines():
            if line.startswith("ollamatrio_loads_total{") and 'result="ok"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


async def mixed(targets: list[str], sequence: list[str], clients: int) -> float:
    """Send ``sequence`` (model names) from ``clients`` concurrent clients, each request to
    the next of ``targets`` in turn; the wall time."""
    turn = itertools.cycle(targets)
    work = iter(sequence)
    begin = time.perf_counter()

    async def client_loop(client: httpx.AsyncClient) -> None:
        for model in work:
            body = {"model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 4}}
            answer = await client.post(f"{next(turn)}/api/generate", json=body)
            answer.raise_for_status()

    async with httpx.AsyncClient(timeout=120) as client, trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client_loop, client)
    return time.perf_counter() - begin


def ingress_app(host: str) -> Any:
    """A Serve ingress deployment that forwards every request to ``host`` and streams its
    answer back: Serve's own data path (proxy, then this replica), as issue 23's prototype."""
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import StreamingResponse

    @serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0})
    class Ingress:
        def __init__(self, host: str) -> None:
            limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
            self.client = httpx.AsyncClient(base_url=host, timeout=None, limits=limits)

        async def __call__(self, request: Request) -> StreamingResponse:
            upstream = self.client.build_request(
                request.method, request.url.path, content=await request.body(),
                headers={"content-type": request.headers.get("content-type", "")},
            )  # fmt: skip
            answer = await self.client.send(upstream, stream=True)

            async def body() -> Any:
                try:
                    async for piece in answer.aiter_raw():
                        yield piece
                finally:
                    await answer.aclose()

            return StreamingResponse(
                body(), status_code=answer.status_code,
                media_type=answer.headers.get("content-type"),
            )  # fmt: skip

    return Ingress.bind(host)


@contextlib.contextmanager
def serve_proxy(host: str, env: dict[str, str]) -> Iterator[tuple[str, Callable[[], float]]]:
    """A one-node Ray cluster (in this namespace) with Serve's proxy in front of an ingress
    for ``host``: its URL, and a function giving the CPU seconds of Serve's processes."""
    import ray
    from ray import serve

    temp = tempfile.mkdtemp(prefix="obf-", dir="/tmp")  # Ray's socket paths must be short
    ray_env = {**env, "RAY_USAGE_STATS_ENABLED": "0", "RAY_memory_monitor_refresh_ms": "0"}
    node = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--port=6379",
         "--node-ip-address=127.0.0.1", "--num-cpus=2", "--object-store-memory=80000000",
         "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}", "--block"],
        env=ray_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert node.stdout is not None
        for line in node.stdout:
            if "Ray runtime started" in line:
                threading.Thread(target=node.stdout.read, daemon=True).start()  # drain
                break
        else:
            raise RuntimeError(f"ray start exited with {node.wait()}")
        ray.init(address="127.0.0.1:6379", logging_level="ERROR", log_to_driver=False)
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(ingress_app(host), name="bench-proxy", route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        while True:  # the proxy answers once the route is known
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/api/version", timeout=5).status_code == 200:
                    break
            time.sleep(0.2)
        serving = [
            proc for proc in psutil.process_iter(["cmdline"])
            if (proc.info["cmdline"] or [""])[0].startswith(SERVE_PROCESSES)
        ]  # fmt: skip

        def serve_cpu() -> float:
            return sum(cpu(proc) for proc in serving)

        yield url, serve_cpu
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        stop(node)  # by PID: ``ray start --block`` stops its node on SIGTERM
        shutil.rmtree(temp, ignore_errors=True)


def unload_all(hosts: list[str], models: list[str]) -> None:
    for url in hosts:
        for model in models:
            httpx.post(f"{url}/api/generate", json={"model": model, "keep_alive": 0}, timeout=30)


def feed(ports: tuple[int, int], streams: int, rate: float, tokens: int) -> None:
    """The floor's host and client, in a process of their own (sharing no GIL with the
    relay): each stream's tokens written at ``rate`` a second, the streams in turn, never
    two at once, and what was relayed drained."""
    line = b'{"model":"m0","response":" fox","done":false}\n'
    framed = b"%x\r\n%b\r\n" % (len(line), line)  # a chunk, as a host writes it
    writers = [socket.create_connection(("127.0.0.1", ports[0])) for _ in range(streams)]
    readers = [socket.create_connection(("127.0.0.1", ports[1])) for _ in range(streams)]
    for _ in range(tokens):
        for writer, reader in zip(writers, readers, strict=True):
            writer.send(framed)
            time.sleep(1 / rate / streams)
            with contextlib.suppress(BlockingIOError):
                reader.recv(65536, socket.MSG_DONTWAIT)


async def trio_relay(pairs: list[tuple[socket.socket, socket.socket]], tokens: int) -> None:
    """Per token one ``wait_readable``, one ``read``, one ``write``: the fewest a Trio task
    can do."""

    async def one(src: socket.socket, dst: socket.socket) -> None:
        for _ in range(tokens):
            await trio.lowlevel.wait_readable(src)
            os.write(dst.fileno(), os.read(src.fileno(), 65536))

    async with trio.open_nursery() as nursery:
        for src, dst in pairs:
            nursery.start_soon(one, src, dst)


def thread_relay(pairs: list[tuple[socket.socket, socket.socket]], tokens: int) -> None:
    """Per token one ``poll``, one ``read``, one ``write`` in a thread per stream: a relay
    that pays no trip through Trio's scheduler."""

    def one(src: socket.socket, dst: socket.socket) -> None:
        poller = select.poll()
        poller.register(src.fileno(), select.POLLIN)
        for _ in range(tokens):
            poller.poll()
            os.write(dst.fileno(), os.read(src.fileno(), 65536))

    threads = [threading.Thread(target=one, args=pair) for pair in pairs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def floor(streams: int, rate: float, tokens: int, trio_loop: bool) -> float:
    """CPU seconds per token of the barest relay over loopback TCP, this process's time
    (every thread): a Trio task per stream (``trio_loop``), else a thread per stream."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    ports = (listeners[0].getsockname()[1], listeners[1].getsockname()[1])
    feeder = multiprocessing.get_context("spawn").Process(
        target=feed, args=(ports, streams, rate, tokens)
    )
    feeder.start()
    sources = [listeners[0].accept()[0] for _ in range(streams)]
    sinks = [listeners[1].accept()[0] for _ in range(streams)]
    for sock in (*sources, *sinks):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
    pairs = list(zip(sources, sinks, strict=True))
    start = time.process_time()
    if trio_loop:
        trio.run(trio_relay, pairs, tokens)
    else:
        thread_relay(pairs, tokens)
    spent = time.process_time() - start
    feeder.join()
    for sock in (*sources, *sinks, *listeners):
        sock.close()
    return spent / (streams * tokens)


def paced(
    paths: dict[str, tuple[str, Callable[[], float]]], host: psutil.Process,
    args: argparse.Namespace,
) -> dict[str, list[Round]]:  # fmt: skip
    """``args.rounds`` rounds of paced streams on each path (a URL and its relay's CPU
    seconds so far), the paths alternating within each round."""
    results: dict[str, list[Round]] = {path: [] for path in paths}
    for _ in range(args.rounds):
        for path, (url, relay_cpu) in paths.items():
            before, host_before = relay_cpu(), cpu(host)
            one = trio.run(paced_round, url, "m0", args)
            one.relay_cpu = relay_cpu() - before
            one.host_cpu = cpu(host) - host_before
            results[path].append(one)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--rate", type=float, default=50.0, help="tokens a second per stream")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--max-loaded", type=int, default=3)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--serve-proxy", action="store_true",
                        help="also through Ray Serve's proxy (needs the fleet extra)")  # fmt: skip
    parser.add_argument("--baseline", metavar="SOURCE_TREE",
                        help="also a gateway run from this source tree (before/after)")  # fmt: skip
    args = parser.parse_args()
    if args.serve_proxy and not os.environ.get(IN_NAMESPACE):
        # Again in a private network and PID namespace: Ray keeps 127.0.0.1 there, and
        # every process it starts ends with the namespace.
        env = {**os.environ, IN_NAMESPACE: "1"}
        sys.exit(subprocess.run([*UNSHARE, sys.executable, *sys.argv], env=env).returncode)
    if os.environ.get(IN_NAMESPACE):
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)

    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    store = ModelStore(work / "models")
    names = [f"m{i}" for i in range(args.models)]
    for seed, name in enumerate(names):
        gguf = write_tiny_gguf(work / f"{name}.gguf", seed=seed)
        for _ in import_gguf(store, name, gguf):
            pass
    env = {
        **os.environ, "OLLAMA_MODELS": str(work / "models"), "OLLAMA_HOST": "127.0.0.1:0",
        "OLLAMATRIO_ENGINE": "simulated", "OLLAMATRIO_SIMULATED_GPUS": SYSTEM,
        "OLLAMATRIO_SIMULATED_ENGINE": json.dumps(
            {"default": {"load_seconds": 0.05, "tokens_per_second": args.rate}}
        ),
        "OLLAMA_NUM_PARALLEL": str(args.streams), "OLLAMA_MAX_LOADED_MODELS": str(args.max_loaded),
    }  # fmt: skip
    procs: list[subprocess.Popen[str]] = []
    try:
        hosts = []
        for _ in range(2):
            proc, url = start(["serve"], env, r"Listening on (http://\S+)", stdout=False)
            procs.append(proc)
            hosts.append(url)
        gw_env = {**env, "OLLAMA_HOST": f"127.0.0.1:{free_port()}"}
        proc, gateway = start(["fleet", "gateway", *hosts], gw_env, r"ready: (http://\S+)", True)
        procs.append(proc)
        gw_proc = psutil.Process(proc.pid)
        baseline: tuple[str, psutil.Process] | None = None
        if args.baseline:  # the same gateway command from another source tree
            tree = str(Path(args.baseline).resolve())
            base_env = {**gw_env, "OLLAMA_HOST": f"127.0.0.1:{free_port()}", "PYTHONPATH": tree}
            pattern = r"ready: (http://\S+)"
            proc, url = start(["fleet", "gateway", *hosts], base_env, pattern, True, cwd=tree)
            procs.append(proc)
            baseline = (url, psutil.Process(proc.pid))
        # Both hosts up behind the gateway before anything is measured.
        for url in [gateway] + ([baseline[0]] if baseline else []):
            while "ollamatrio_fleet_hosts_up 2.0" not in httpx.get(f"{url}/metrics").text:
                time.sleep(0.1)

        # Paced streams: load m0 through the gateway, then find the host that holds it.
        httpx.post(f"{gateway}/api/generate", json={"model": "m0"}, timeout=60)
        holder = next(r["replica"] for r in httpx.get(f"{gateway}/api/ps").json()["models"])
        host_proc = psutil.Process(procs[hosts.index(holder)].pid)
        with contextlib.ExitStack() as stack:
            paths: dict[str, tuple[str, Callable[[], float]]] = {
                "direct": (holder, lambda: 0.0), "gateway": (gateway, lambda: cpu(gw_proc)),
            }  # fmt: skip
            if baseline is not None:
                base_url, base_proc = baseline
                paths["baseline"] = (base_url, lambda: cpu(base_proc))
            if args.serve_proxy:
                paths["serve"] = stack.enter_context(serve_proxy(holder, env))
            results = paced(paths, host_proc, args)
        print(f"paced streams: {args.streams} x {args.tokens} tokens at {args.rate:g} tok/s, "
              f"{args.rounds} rounds each (medians over rounds)")  # fmt: skip
        print(f"{'path':<8} {'TTFT p50 ms':>11} {'gap p50 ms':>10} {'gap p99 ms':>10} "
              f"{'relay CPU us/token':>18} {'host CPU us/token':>17}")  # fmt: skip
        ttft = {}
        for path, rounds in results.items():
            ttft[path] = statistics.median(pct(r.ttfts, 0.5) for r in rounds) * 1e3
            p50 = statistics.median(pct(r.gaps, 0.5) for r in rounds) * 1e3
            p99 = statistics.median(pct(r.gaps, 0.99) for r in rounds) * 1e3
            per_token = statistics.median(r.relay_cpu / r.tokens for r in rounds) * 1e6
            host = statistics.median(r.host_cpu / r.tokens for r in rounds) * 1e6
            shown = f"{per_token:.1f}" if path != "direct" else "-"
            print(f"{path:<8} {ttft[path]:>11.2f} {p50:>10.2f} {p99:>10.2f} {shown:>18} "
                  f"{host:>17.1f}")  # fmt: skip
        for path in [p for p in ttft if p != "direct"]:
            print(f"{path} TTFT over direct: {ttft[path] - ttft['direct']:+.2f} ms")
        tokens = min(args.tokens, 400)
        for label, trio_loop in (("a Trio task", True), ("a poll loop in a thread", False)):
            per_token = floor(args.streams, args.rate, tokens, trio_loop) * 1e6
            print(f"floor (bare relay over TCP, {label} per stream, same pacing): "
                  f"{per_token:.1f} us CPU per token")  # fmt: skip

        # Mixed models: the same seeded sequence, through the gateway and round-robin.
        sequence = random.Random(23).choices(names, k=args.requests)
        print(f"\nmixed models: {args.requests} requests over {args.models} models, "
              f"{args.clients} clients, at most {args.max_loaded} loaded per host")  # fmt: skip
        print(f"{'routing':<26} {'model loads':>11} {'wall s':>7} {'gateway CPU us/request':>22}")
        for label, targets in (("gateway (this policy)", [gateway]), ("round-robin", hosts)):
            unload_all(hosts, names)
            before, cpu_before = loads(hosts), cpu(gw_proc)
            wall = trio.run(mixed, targets, sequence, args.clients)
            per_request = (cpu(gw_proc) - cpu_before) / args.requests * 1e6
            shown = f"{per_request:.0f}" if targets == [gateway] else "-"
            print(f"{label:<26} {loads(hosts) - before:>11.0f} {wall:>7.2f} {shown:>22}")
    finally:
        for proc in reversed(procs):
            stop(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
