"""A parent that starts a runner, prints the runner's pid, and waits to be SIGKILLed.

Usage: python tests/helpers/orphan_runner.py MODEL.gguf
"""

from __future__ import annotations

import sys

import trio

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.engines.protocol import LoadSpec


async def main(model: str) -> None:
    async with ProcessEngineFactory().open(LoadSpec(model_path=model, name="orphan")) as engine:
        print(engine.pid, flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
