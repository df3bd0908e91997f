"""The README's "Embedding in a Trio program" example runs as written, on the simulated
engine and devices instead of a real runner and model path."""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

import pytest

from ollamatrio.devices import SimulatedDevices
from ollamatrio.engines.simulated import SimulatedBehaviour, SimulatedEngineFactory
from ollamatrio.scheduler import open_scheduler

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def embedding_example() -> str:
    section = README.read_text().split("## Embedding in a Trio program", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


async def test_the_readme_embedding_example_runs(
    autojump_clock: Any, tiny_gguf: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    source = embedding_example()
    assert source.rstrip().endswith("trio.run(main)")
    source = source.rstrip().removesuffix("trio.run(main)")  # already inside trio here
    source = source.replace("/path/to/model.gguf", str(tiny_gguf()))
    namespace: dict[str, Any] = {}
    exec(compile(source, str(README), "exec"), namespace)
    devices = SimulatedDevices(json.dumps({"gpus": [], "system": {"total": 2**34}}))
    engines = SimulatedEngineFactory(
        devices, default=SimulatedBehaviour(load_seconds=0.1, default_num_predict=5)
    )
    namespace["open_scheduler"] = functools.partial(
        open_scheduler, engines=engines, devices=devices
    )
    await namespace["main"]()
    assert len(capsys.readouterr().out.split()) == 5
