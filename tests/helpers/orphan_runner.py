"""A parent that starts runners, prints one JSON line per runner, and waits to be SIGKILLed.

Usage: python tests/helpers/orphan_runner.py MODEL.gguf [COUNT] [idle|busy]

Each line is ``{"pid": runner pid, "dir": its private folder}``, printed once the runner
is ready (``idle``) or once its generation has streamed the first piece (``busy``; the
generation keeps streaming until the parent dies).
"""

from __future__ import annotations

import json
import os
import sys

import trio

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.types import CompletionRequest, LoadSpec

ENDLESS = CompletionRequest(
    prompt="hello", options={"num_predict": -1, "ignore_eos": True, "temperature": 1.0}
)


async def one(model: str, index: int, busy: bool) -> None:
    spec = LoadSpec(model_path=model, name=f"orphan-{index}")
    async with ProcessEngineFactory().open(spec) as engine:
        line = json.dumps({"pid": engine.pid, "dir": os.path.dirname(engine.ready.socket)})
        if not busy:
            print(line, flush=True)
            await trio.sleep_forever()
        async with engine.complete(ENDLESS) as chunks:
            async for _ in chunks:
                if line:
                    print(line, flush=True)
                    line = ""
        await trio.sleep_forever()


async def main(model: str, count: int, busy: bool) -> None:
    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(one, model, index, busy)


if __name__ == "__main__":
    args = sys.argv[1:]
    trio.run(main, args[0], int(args[1]) if len(args) > 1 else 1, args[2:] == ["busy"])
