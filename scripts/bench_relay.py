#!/usr/bin/env python3
"""Benchmark the token relay: what the server costs per streamed token, and its time to first
token and throughput against llama.cpp's own socket, at several concurrent streams.

A tiny generated model (random weights, so decoding is fast and the relay, not the model,
dominates) is imported into a temporary store and served by ``python -m ollamatrio serve`` in
a subprocess, so the server's CPU time (``psutil``, the server process alone, not its
runners) can be divided by the tokens it relayed.  The reference is a runner this script
starts itself with the same options, hit directly on its Unix socket with the same client
library (httpx) as the API path, so client-side costs cancel out.  Both paths get the same
raw prompt, greedy sampling, ``ignore_eos`` and ``num_predict``; every client holds one
keep-alive connection, as the official clients do.  Paths alternate round by round.  With
``--before <checkout>`` a second server runs that checkout's code side by side, and its rounds
are interleaved with the others (an A/B comparison that a noisy machine affects alike).

    .venv/bin/python scripts/bench_relay.py [--streams 1,4,8,32] [--tokens 64] [--rounds 5]
        [--before /path/to/other/checkout] [--mixed]

``--pin`` (Linux): every runner and this client on the last CPU, the servers on the others, so
the server does not take its CPU from llama.cpp or the client: how a GPU machine, where the
model computes on the GPU and the server has a core of its own, divides the work.  Both paths
then run their runner and client under the same conditions, and throughput against direct
says whether the relay keeps pace with the runner, not who wins the cores.

``--variant NAME:VAR=VALUE[,VAR=VALUE]`` (repeatable) serves this checkout once more with
those environment variables set, as one more API path (``cache-off:OLLAMATRIO_PROMPT_CACHE=0``).
Each round starts with the next path in turn, so that none always follows the same one.
``--long-prompt`` sends about 500 tokens instead of four words (with ``--num-ctx 1024``), and
``--saved-state`` first has every server serve another long prompt and unload, so that its
next load finds a state in the on-disk prompt cache that the measured prompt does not begin:
what a restart leaves behind.

``--tls``: this checkout once more over HTTPS (``OLLAMATRIO_TLS_CERT``/``_KEY``, a throw-away
authority and certificate made with ``openssl``) as one more API path, ``tls``, its rounds
interleaved: the relay's cost per token with TLS against without (the ``after`` path).

``--mixed``: every API request is an ``/api/show`` and then a streamed ``/api/chat`` on the
same keep-alive connection (the official clients' pattern); CPU per token includes the show.

``--against-ollama``: the reference Ollama (``scripts/ollama_ref.py``: release 0.24 from
``../shared/ollama/``, unpacked into a temporary folder) serves the same model, created in
its own store from the same GGUF, as one more API path with its rounds interleaved; a second
table gives the ratios ollamatrio / Ollama, and both servers' start-up time (process start to
first answer) and idle memory (the process tree's RSS before any model is loaded).  Ollama
has no ``ignore_eos``: the tiny model's weights are chosen so that greedy decoding meets no
end-of-sequence token (seed 2, checked to 250 tokens), and ``--model`` (for example SmolLM2)
must be one whose answer to the prompt runs to ``--tokens``.

Columns: server CPU µs per relayed token (its kernel share); the same for the server's
whole process tree, its runners included (the model's own work: what a user's machine pays
per token); TTFT p50/p99 (request sent -> first token) through the API and direct;
aggregate tokens/s through the API and direct, and their ratio (medians over rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import trio
from ollama_ref import (
    find_tarball,
    free_port,
    running_ollama,
    tree_cpu,
    tree_rss,
    wait_answering,
)

from ollamatrio.engines.llamacpp_wire import completion_request
from ollamatrio.engines.process import ProcessEngine, ProcessEngineFactory
from ollamatrio.store import ModelStore, import_gguf
from ollamatrio.testing import write_tiny_gguf
from ollamatrio.testing.certificates import make_certificates
from ollamatrio.types import CompletionRequest, LoadSpec

PROMPT = "Once upon a time"
# ``--long-prompt``: about 500 tokens (SmolLM2), past the 256 from which a saved prompt state
# may be restored; ``--saved-state`` leaves a state of OTHER_PROMPT, which it does not begin.
LONG_PROMPT = " ".join(f"Rule {i}: answer in one short sentence." for i in range(60)) + " " + PROMPT
OTHER_PROMPT = " ".join(f"Fact {i}: the sky was green that day." for i in range(60))


@dataclass
class Round:
    ttfts: list[float]
    tokens: int
    wall: float
    server_cpu: float = 0.0
    server_sys: float = 0.0  # the kernel's share of server_cpu (socket system calls)
    tree_cpu: float = 0.0  # the server and its runners


def options(tokens: int, threads: int, num_ctx: int = 256) -> dict[str, object]:
    return {
        "num_predict": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "num_thread": threads,
        "num_ctx": num_ctx,
    }


async def api_stream(
    client: httpx.AsyncClient, tokens: int, threads: int, mixed: bool = False,
    prompt: str = PROMPT, num_ctx: int = 256,
) -> tuple[float, int]:  # fmt: skip
    """One streamed generation; ``mixed``: ``/api/show`` first, then a streamed ``/api/chat``
    on the same connection, as the official clients do (TTFT counts from the chat)."""
    if mixed:
        (await client.post("/api/show", json={"model": "tiny"})).raise_for_status()
        path, field = "/api/chat", "message"
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": prompt}],
            "options": options(tokens, threads, num_ctx),
        }
    else:
        path, field = "/api/generate", "response"
        body = {
            "model": "tiny", "prompt": prompt, "raw": True,
            "options": options(tokens, threads, num_ctx),
        }  # fmt: skip
    start = time.perf_counter()
    ttft = 0.0
    count = 0
    async with client.stream("POST", path, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line:
                continue
            obj = json.loads(line)
            piece = obj.get(field)
            if piece and (not mixed or piece.get("content")):
                count += 1
                ttft = ttft or time.perf_counter() - start
            if obj.get("done"):
                # Tokens decoded, as the server counts them: a token that ends inside a
                # multi-byte character sends no text of its own (Ollama holds it back).
                count = obj.get("eval_count", count)
    return ttft, count


async def direct_stream(runner: httpx.AsyncClient, body: bytes) -> tuple[float, int]:
    """The same request on the runner's socket, with the same client library as the API
    path (so client-side costs cancel out of the comparison)."""
    start = time.perf_counter()
    ttft = 0.0
    count = 0
    async with runner.stream("POST", "/completion", content=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and json.loads(line[6:]).get("content"):
                count += 1
                ttft = ttft or time.perf_counter() - start
    return ttft, count


async def run_round(streams: int, one: object) -> Round:
    ttfts: list[float] = []
    total = 0

    async def client(i: int) -> None:
        nonlocal total
        ttft, count = await one(i)  # type: ignore[operator]
        ttfts.append(ttft)
        total += count

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(streams):
            nursery.start_soon(client, i)
    return Round(ttfts, total, time.perf_counter() - start)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Server:
    """A ``python -m ollamatrio serve`` subprocess, measured as one path."""

    name: str
    url: str
    pid: int
    clients: list[httpx.AsyncClient]
    rounds: dict[int, list[Round]]
    started_in: float = 0.0  # seconds from process start to first answer
    idle_rss: int = 0  # bytes, the process tree before any model is loaded
    verify: ssl.SSLContext | bool = True  # what an https:// server is checked against


async def start_server(
    nursery: trio.Nursery, store: ModelStore, most: int, code: str | None, profile: str | None,
    extra_env: dict[str, str] | None = None, verify: ssl.SSLContext | bool = True,
    *, task_status: trio.TaskStatus[tuple[int, int, float]] = trio.TASK_STATUS_IGNORED,
) -> None:  # fmt: skip
    """Run a server (``code``: another checkout's package; ``extra_env``: variables set for
    it alone) until cancelled; started() gets its port, pid and start-up time, once it
    answers."""
    port = free_port()
    env = dict(
        os.environ,
        OLLAMA_HOST=f"127.0.0.1:{port}",
        OLLAMA_MODELS=str(store.root),
        OLLAMA_NUM_PARALLEL=str(most),
        OLLAMA_KEEP_ALIVE="-1",
        OLLAMA_MAX_QUEUE="4096",
        **(extra_env or {}),
    )
    if code:  # serve another checkout's code (A/B against an older version)
        env["PYTHONPATH"] = code  # an absolute path
    started = time.perf_counter()
    server = await trio.lowlevel.open_process(
        [sys.executable, "-m", "ollamatrio", "serve"],
        env=env,
        # ``python -m`` puts the working directory ahead of PYTHONPATH: run from the
        # other checkout, or this checkout's package is the one imported.
        cwd=code,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    profiler: trio.Process | None = None
    try:
        if profile:
            # py-spy from this interpreter's folder when the venv is not on PATH.
            spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
            profiler = await trio.lowlevel.open_process(
                [spy, "record", "-p", str(server.pid), "-o", profile, "-f", "raw", "-r", "200"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        scheme = "https" if env.get("OLLAMATRIO_TLS_CERT") else "http"
        started_in = await wait_answering(f"{scheme}://127.0.0.1:{port}", started, verify=verify)
        task_status.started((port, server.pid, started_in))
        await trio.sleep_forever()
    finally:
        # Whatever failed (the profiler too), the server does not outlive the benchmark.
        with trio.CancelScope(shield=True):
            if profiler is not None:
                profiler.send_signal(2)
                with trio.move_on_after(30):
                    await profiler.wait()
            server.terminate()
            with trio.move_on_after(30):
                await server.wait()
            server.kill()


async def main(args: argparse.Namespace) -> None:
    stream_counts = [int(s) for s in args.streams.split(",")]
    most = max(stream_counts)
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as tmp:
        root = Path(tmp)
        if args.model is not None:
            model = args.model.resolve()
        else:
            # Seed 2: greedy decoding meets no end-of-sequence token (see --against-ollama).
            model = write_tiny_gguf(
                root / "tiny.gguf", layers=2, embd=64, vocab=300, ctx=4096, seed=2
            )
        store = ModelStore(root / "models")
        for _ in import_gguf(store, "tiny", model):
            pass
        async with AsyncExitStack() as stack:
            nursery = await stack.enter_async_context(trio.open_nursery())
            servers = []
            variants: list[tuple[str, str | None, str | None, dict[str, str]]] = [
                ("after", args.server_path, args.profile, {}),
                *((name, args.server_path, None, env) for name, env in args.variant),
            ]
            if args.before:
                variants.append(("before", args.before, None, {}))
            verify: ssl.SSLContext | bool = True
            if args.tls:
                made = make_certificates(root / "tls")
                verify = ssl.create_default_context(cafile=made.ca)
                tls_env = {
                    "OLLAMATRIO_TLS_CERT": str(made.cert),
                    "OLLAMATRIO_TLS_KEY": str(made.key),
                }
                variants.append(("tls", args.server_path, None, tls_env))
            for name, code, profile, extra_env in variants:
                port, pid, started_in = await nursery.start(
                    start_server, nursery, store, most, code, profile, extra_env, verify
                )
                scheme = "https" if "OLLAMATRIO_TLS_CERT" in extra_env else "http"
                url = f"{scheme}://127.0.0.1:{port}"
                clients = [
                    httpx.AsyncClient(base_url=url, timeout=120, verify=verify) for _ in range(most)
                ]
                servers.append(Server(name, url, pid, clients, {}, started_in, verify=verify))
            if args.against_ollama:
                env = {
                    "OLLAMA_NUM_PARALLEL": str(most),
                    "OLLAMA_KEEP_ALIVE": "-1",
                    "OLLAMA_MAX_QUEUE": "4096",
                }
                ollama = await stack.enter_async_context(
                    running_ollama(
                        find_tarball(args.ollama_tarball), args.ollama_port or free_port(), env
                    )
                )
                await ollama.create("tiny", f"FROM {model}\n")
                clients = [httpx.AsyncClient(base_url=ollama.url, timeout=120) for _ in range(most)]
                servers.append(
                    Server("ollama", ollama.url, ollama.pid, clients, {}, ollama.started_in)
                )
            for server in servers:
                server.idle_rss = tree_rss(server.pid)
            await measure(args, stream_counts, most, model, servers)
            nursery.cancel_scope.cancel()


async def wait_ready(url: str, verify: ssl.SSLContext | bool = True) -> None:
    """Wait until the server answers."""
    # Readiness on a connection of its own: the clients' connections carry only generations
    # (a server may serve those on a faster path than other requests).
    async with httpx.AsyncClient(base_url=url, verify=verify) as probe:
        with trio.fail_after(60):
            while True:
                try:
                    await probe.get("/api/version")
                    break
                except httpx.TransportError:
                    await trio.sleep(0.1)


async def measure(
    args: argparse.Namespace, stream_counts: list[int], most: int, model: Path,
    servers: list[Server],
) -> None:  # fmt: skip
    for server in servers:
        await wait_ready(server.url, server.verify)
    prompt = LONG_PROMPT if args.long_prompt else PROMPT
    if args.saved_state:
        for server in servers:
            if server.name != "ollama":
                await leave_saved_state(server, args)
    spec = LoadSpec(
        model_path=str(model), name="tiny", num_ctx=args.num_ctx, num_parallel=most, num_batch=512,
        num_thread=args.threads, num_gpu=0 if args.cpu else -1,
    )  # fmt: skip
    factory = ProcessEngineFactory(load_timeout=120)
    async with factory.open(spec) as engine:
        assert isinstance(engine, ProcessEngine)
        runner = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=engine.ready.socket),
            base_url="http://runner",
            headers={"Authorization": f"Bearer {engine._config.api_key}"},
            timeout=120,
        )
        _, body = completion_request(
            CompletionRequest(
                prompt=prompt, options=options(args.tokens, args.threads, args.num_ctx)
            ),
            engine.context_length,
        )
        direct_body = json.dumps(body).encode()

        def via_api(server: Server) -> object:
            async def one(i: int) -> tuple[float, int]:
                return await api_stream(
                    server.clients[i], args.tokens, args.threads, args.mixed, prompt, args.num_ctx
                )

            return one

        async def via_direct(i: int) -> tuple[float, int]:
            return await direct_stream(runner, direct_body)

        # Load the model in each server and warm every client's connection.
        for server in servers:
            await run_round(most, via_api(server))
        await run_round(most, via_direct)
        if args.pin:
            pin_cpus(engine.pid, [s.pid for s in servers])
        direct: dict[int, list[Round]] = {}
        paths: list[Server | None] = [*servers, None]  # None: direct
        for streams in stream_counts:
            for number in range(args.rounds):
                # Each round starts with the next path: none always follows the same one.
                shift = number % len(paths)
                for server in paths[shift:] + paths[:shift]:
                    if server is None:
                        direct.setdefault(streams, []).append(await run_round(streams, via_direct))
                        continue
                    process = psutil.Process(server.pid)
                    before, tree_before = process.cpu_times(), tree_cpu(server.pid)
                    r = await run_round(streams, via_api(server))
                    after, r.tree_cpu = process.cpu_times(), tree_cpu(server.pid) - tree_before
                    r.server_sys = after.system - before.system
                    r.server_cpu = (after.user - before.user) + r.server_sys
                    server.rounds.setdefault(streams, []).append(r)
        await runner.aclose()
    for server in servers:
        for c in server.clients:
            await c.aclose()
    report(args, stream_counts, servers, direct)


async def leave_saved_state(server: Server, args: argparse.Namespace) -> None:
    """``--saved-state``: serve OTHER_PROMPT and unload, so that the server's next load finds
    a state in its on-disk prompt cache that the measured prompt does not begin (what a
    restart leaves behind).  The same options as the measured requests: the same cache key."""
    client = server.clients[0]
    body = {
        "model": "tiny", "prompt": OTHER_PROMPT, "raw": True, "stream": False,
        "options": options(4, args.threads, args.num_ctx),
    }  # fmt: skip
    (await client.post("/api/generate", json=body)).raise_for_status()
    unload = {"model": "tiny", "keep_alive": 0}
    (await client.post("/api/generate", json=unload)).raise_for_status()
    with trio.fail_after(60):
        while (await client.get("/api/ps")).json()["models"]:  # noqa: ASYNC110
            await trio.sleep(0.05)  # another process's state: nothing to wait on but polling


def pin_cpus(direct_runner: int | None, servers: list[int]) -> None:
    """``--pin``: every runner (the servers' and the direct one) and this client on the last
    CPU, the servers on the others.  Both paths then run their runner and client under the
    same conditions, and the API path's one extra party, the server, has CPUs of its own
    (as on a GPU machine, where the model computes on the GPU and the server has a core)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least two CPUs")
    shared, rest = {cpus[-1]}, set(cpus[:-1])
    runners = [direct_runner] if direct_runner is not None else []
    for pid in servers:
        runners += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        set_affinity(pid, rest)
    for pid in runners:
        set_affinity(pid, shared)
    set_affinity(os.getpid(), shared)
    print(
        f"pinned: runners {sorted(runners)} and client on CPU {cpus[-1]}; servers on {sorted(rest)}"
    )


def set_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` (affinity is per thread; threads made later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that just ended


@dataclass
class Row:
    """One server's medians at one stream count."""

    cpu: float  # server process µs per token
    kernel: float  # its kernel share
    tree: float  # server + runners, µs per token
    p50: float  # TTFT seconds
    p99: float
    tps: float  # aggregate tokens/s
    tokens: float  # tokens per request (mean)


def summarize(rounds: list[Round]) -> Row:
    relayed = sum(r.tokens for r in rounds)
    ttfts = [t for r in rounds for t in r.ttfts]
    return Row(
        cpu=sum(r.server_cpu for r in rounds) / relayed * 1e6,
        kernel=sum(r.server_sys for r in rounds) / relayed * 1e6,
        tree=sum(r.tree_cpu for r in rounds) / relayed * 1e6,
        p50=statistics.median(ttfts),
        p99=pct(ttfts, 0.99),
        tps=statistics.median(r.tokens / r.wall for r in rounds),
        tokens=relayed / len(ttfts),
    )


def report(
    args: argparse.Namespace, stream_counts: list[int], servers: list[Server],
    direct: dict[int, list[Round]],
) -> None:  # fmt: skip
    names = " / ".join(s.name for s in servers)
    print(
        f"{args.model.name if args.model else 'tiny model'}, {args.tokens} tokens per request, "
        f"{args.rounds} rounds per row, llama.cpp threads {args.threads}, one keep-alive "
        f"client per stream"
        f"{' (mixed: /api/show, then a streamed /api/chat)' if args.mixed else ''}"
        f"{'; long prompt' if args.long_prompt else ''}"
        f"{'; a saved state the prompt does not begin' if args.saved_state else ''}; "
        f"API columns: {names}"
    )
    print(
        f"| streams | server CPU µs/token (kernel), {names} | server + runners CPU µs/token "
        f"{names} | TTFT p50 ms {names} / direct | TTFT p99 ms {names} / direct "
        f"| tokens/s {names} / direct (ratios) |"
    )
    print("|---|---|---|---|---|---|")
    rows: dict[int, list[Row]] = {}
    for streams in stream_counts:
        rows[streams] = [summarize(server.rounds[streams]) for server in servers]
        own = rows[streams]
        d = summarize(direct[streams])
        cpu = " / ".join(f"{r.cpu:.1f} ({r.kernel:.1f})" for r in own)
        tree = " / ".join(f"{r.tree:.0f}" for r in own)
        p50 = " / ".join(f"{r.p50 * 1e3:.2f}" for r in [*own, d])
        p99 = " / ".join(f"{r.p99 * 1e3:.2f}" for r in [*own, d])
        ratios = ", ".join(f"{r.tps / d.tps:.3f}" for r in own)
        tps = " / ".join(f"{r.tps:.0f}" for r in own)
        print(f"| {streams} | {cpu} | {tree} | {p50} | {p99} | {tps} / {d.tps:.0f} ({ratios}) |")
    for streams in stream_counts:
        d = summarize(direct[streams])
        pairs = zip(servers, rows[streams], strict=True)
        over = ", ".join(f"{s.name} {(r.p50 - d.p50) * 1e3:+.2f}" for s, r in pairs)
        print(f"TTFT p50 over direct, {streams} streams (ms): {over}")
    if servers[-1].name == "ollama":
        report_against_ollama(stream_counts, servers, rows)


def report_against_ollama(
    stream_counts: list[int], servers: list[Server], rows: dict[int, list[Row]]
) -> None:
    """ollamatrio (the first server) over Ollama (the last): below 1 is ollamatrio's lead,
    except for tokens/s, where above 1 is."""
    ours, theirs = servers[0], servers[-1]
    print()
    print("ratios ollamatrio / Ollama (same run, rounds interleaved)")
    print(
        "| streams | server CPU/token | server + runners CPU/token | TTFT p50 | TTFT p99 "
        "| tokens/s | tokens per request, ollamatrio / Ollama |"
    )
    print("|---|---|---|---|---|---|---|")
    for streams in stream_counts:
        a, b = rows[streams][0], rows[streams][-1]
        print(
            f"| {streams} | {ratio(a.cpu, b.cpu)} | {ratio(a.tree, b.tree)} "
            f"| {ratio(a.p50, b.p50)} | {ratio(a.p99, b.p99)} | {ratio(a.tps, b.tps)} "
            f"| {a.tokens:.0f} / {b.tokens:.0f} |"
        )
    print(
        f"| start-up s (to first answer) | {ours.started_in:.2f} / {theirs.started_in:.2f} "
        f"= {ratio(ours.started_in, theirs.started_in)} |"
    )
    print(
        f"| idle RSS MiB (process tree) | {ours.idle_rss / 2**20:.0f} / "
        f"{theirs.idle_rss / 2**20:.0f} = {ratio(ours.idle_rss, theirs.idle_rss)} |"
    )


def ratio(a: float, b: float) -> str:
    """``a / b``; "n/a" when ``b`` measured nothing (CPU times tick in 10 ms: use more
    rounds or tokens)."""
    return f"{a / b:.2f}" if b > 0 else "n/a"


def variant(text: str) -> tuple[str, dict[str, str]]:
    """``--variant``'s ``NAME:VAR=VALUE[,VAR=VALUE]``."""
    name, sep, assignments = text.partition(":")
    env = dict(a.split("=", 1) for a in assignments.split(",") if "=" in a)
    if not name or not sep or not env:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME:VAR=VALUE[,VAR=VALUE]")
    return name, env


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,4,8,32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cpu", action="store_true", help="keep the direct runner off GPUs")
    parser.add_argument(
        "--pin", action="store_true",
        help="runners and this client on the last CPU, the servers on the others (Linux)",
    )  # fmt: skip
    parser.add_argument(
        "--tls",
        action="store_true",
        help="also serve this checkout over HTTPS (a throw-away certificate), rounds interleaved",
    )
    parser.add_argument(
        "--mixed", action="store_true",
        help="each API request is /api/show then a streamed /api/chat on the same connection",
    )  # fmt: skip
    parser.add_argument("--profile", help="record the server with py-spy (raw) into this file")
    parser.add_argument(
        "--server-path", type=os.path.abspath, help="serve the ollamatrio package of this checkout"
    )
    parser.add_argument(
        "--before", type=os.path.abspath,
        help="also serve this checkout's package, side by side, rounds interleaved (A/B)",
    )  # fmt: skip
    parser.add_argument(
        "--variant", type=variant, action="append", default=[], metavar="NAME:VAR=VALUE[,...]",
        help="also serve this checkout with these environment variables set, rounds "
        "interleaved (repeatable; e.g. 'cache-off:OLLAMATRIO_PROMPT_CACHE=0')",
    )  # fmt: skip
    parser.add_argument(
        "--long-prompt", action="store_true",
        help="a prompt of about 500 tokens (SmolLM2) instead of four words (use --num-ctx 1024)",
    )  # fmt: skip
    parser.add_argument(
        "--saved-state", action="store_true",
        help="each server first serves another long prompt and unloads, leaving a state in its "
        "on-disk prompt cache that the measured prompt does not begin",
    )  # fmt: skip
    parser.add_argument("--num-ctx", type=int, default=256, help="context per slot")
    parser.add_argument("--model", type=Path, help="a GGUF to serve instead of the tiny model")
    parser.add_argument(
        "--against-ollama", action="store_true",
        help="also serve the model with the reference Ollama (../shared/ollama), interleaved",
    )  # fmt: skip
    parser.add_argument("--ollama-tarball", type=Path, help="the reference Ollama's tarball")
    parser.add_argument("--ollama-port", type=int, default=0, help="its port (0: a free one)")
    trio.run(main, parser.parse_args())
