"""A runner imports the engine in its main thread, and sees only the GPUs its load was given.

CUDA builds of xllamacpp crash (SIGSEGV) when imported after numpy (and were reported to when
first imported off the main thread), and a CUDA
runner placed on the CPU would still create a CUDA context (~545 MB of VRAM nobody booked)
unless every device is hidden from it.  These run everywhere: a fake ``xllamacpp`` package
stands in for the engine where the test is about the import, and the environment a real
runner was started with is read back from ``/proc``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil
import pytest
import trio

from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.errors import RunnerStartError
from ollamatrio.runner.visibility import HIDE_ALL, visible_devices_env
from ollamatrio.types import LoadSpec

FAKE_ENGINE = """\
import os, sys, threading
with open(os.environ["FAKE_ENGINE_RECORD"], "a") as record:
    main = threading.current_thread() is threading.main_thread()
    record.write(f"main={main} numpy={'numpy' in sys.modules}\\n")
raise ImportError("fake engine: recorded the importing thread")
"""

UUIDS = ("GPU-aaaa1111-0000-0000-0000-000000000000", "GPU-bbbb2222-0000-0000-0000-000000000000")


def _fake_engine_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    package = tmp_path / "fake" / "xllamacpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_ENGINE)
    record = tmp_path / "record.txt"
    env = {
        **os.environ,
        # After the package root, before the rest of the path (site-packages, or wherever
        # the engine was installed: a GPU machine may put it on PYTHONPATH).
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(tmp_path / "fake"), os.environ.get("PYTHONPATH")) if p
        ),
        "FAKE_ENGINE_RECORD": str(record),
    }
    return env, record


async def test_engine_is_imported_in_the_main_thread_before_numpy(
    tmp_path: Path, tiny_gguf
) -> None:
    env, record = _fake_engine_env(tmp_path)
    factory = ProcessEngineFactory(env=env, kill_grace=2.0)
    spec = LoadSpec(model_path=str(tiny_gguf()), name="tiny")
    with trio.fail_after(60), pytest.raises(RunnerStartError) as caught:
        async with factory.open(spec):
            pytest.fail("a runner loaded without an engine")
    assert record.read_text() == "main=True numpy=False\n"
    # The import failure is the runner's one error event, not a bare exit.
    message = str(caught.value)
    assert message.startswith("llama runner failed to load model 'tiny': ")
    assert "fake engine: recorded the importing thread" in message


# -- which devices a runner may see ----------------------------------------------------------


@pytest.mark.parametrize(
    ("num_gpu", "gpu_ids", "cuda"),
    [
        (0, (), ""),
        (0, UUIDS, ""),  # placed on the CPU although GPUs were named
        (-1, (), ""),  # "all layers" but no GPU given: nothing to use
        (999, (), ""),
        (-1, UUIDS[:1], UUIDS[0]),
        (20, UUIDS, ",".join(UUIDS)),
    ],
)
def test_visible_devices_env(num_gpu: int, gpu_ids: tuple[str, ...], cuda: str) -> None:
    env = visible_devices_env(LoadSpec("m.gguf", "m", num_gpu=num_gpu, gpu_ids=gpu_ids))
    assert env == {**HIDE_ALL, "CUDA_VISIBLE_DEVICES": cuda}
    # Every other runtime llama.cpp may be built with sees no device, on both paths.
    assert env["GGML_VK_VISIBLE_DEVICES"] == ""
    assert env["HIP_VISIBLE_DEVICES"] == env["ROCR_VISIBLE_DEVICES"] == "-1"


def test_factory_env_hides_gpus_from_cpu_loads() -> None:
    inherited = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", "GGML_VK_VISIBLE_DEVICES": "0"}
    factory = ProcessEngineFactory(env=inherited)
    cpu = factory.runner_env(LoadSpec("m.gguf", "m", num_gpu=0, gpu_ids=UUIDS))
    gpu = factory.runner_env(LoadSpec("m.gguf", "m", num_gpu=-1, gpu_ids=UUIDS[1:]))
    assert {k: cpu[k] for k in HIDE_ALL} == HIDE_ALL
    assert {k: gpu[k] for k in HIDE_ALL} == {**HIDE_ALL, "CUDA_VISIBLE_DEVICES": UUIDS[1]}
    assert cpu["PATH"] == gpu["PATH"] == "/bin"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/environ")
async def test_cpu_runner_starts_with_every_gpu_hidden(tiny_gguf) -> None:
    """The environment the real runner process got, read back from the kernel."""
    factory = ProcessEngineFactory(env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
    spec = LoadSpec(model_path=str(tiny_gguf()), name="tiny", num_ctx=256)
    with trio.fail_after(60):
        async with factory.open(spec) as engine:
            assert engine.pid is not None
            environ = psutil.Process(engine.pid).environ()
            assert engine.memory.vram_by_gpu == {}
    assert {k: environ.get(k) for k in HIDE_ALL} == HIDE_ALL
