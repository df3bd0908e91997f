"""On a real NVIDIA GPU with a CUDA build of xllamacpp: runners offload, CPU runners hold no
VRAM, the scheduler books and reports the GPU.  Every test here skips cleanly elsewhere (the
``gpu`` marker; see ``conftest.pytest_runtest_setup``)."""

from __future__ import annotations

import logging

import httpx
import pytest
import trio
from helpers.gpu import NvidiaGpu, nvidia_gpus
from helpers.runner_process import start_raw_runner

from ollamatrio.config import Settings
from ollamatrio.devices import NvmlDevices
from ollamatrio.engines.capability import engine_device_source, probe_engine
from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.scheduler import ModelRequest, open_scheduler
from ollamatrio.types import CompletionRequest, LoadSpec

pytestmark = pytest.mark.gpu

TIMEOUT = 120
MiB = 1 << 20


@pytest.fixture
def gpu() -> NvidiaGpu:
    return nvidia_gpus()[0]


def test_runner_offloads_to_its_gpu(tiny_gguf, gpu: NvidiaGpu) -> None:
    spec = LoadSpec(
        model_path=str(tiny_gguf()), name="tiny", num_ctx=2048, num_gpu=999, gpu_ids=(gpu.uuid,)
    )
    runner = start_raw_runner(spec)
    try:
        assert runner.ready["event"] == "ready", runner.ready
        assert runner.ready["plan"]["n_gpu_layers"] == 999
        vram = runner.ready["memory"]["vram_by_gpu"]
        assert set(vram) == {gpu.uuid}
        assert vram[gpu.uuid] > 100 * MiB  # at least the CUDA context (measured ~546 MiB)
        transport = httpx.HTTPTransport(uds=runner.socket)
        headers = {"Authorization": f"Bearer {runner.config.api_key}"}
        with httpx.Client(transport=transport, headers=headers, timeout=60) as client:
            reply = client.post("http://runner/completion", json={"prompt": "hi", "n_predict": 4})
        assert reply.status_code == 200
        assert reply.json()["tokens_predicted"] == 4
    finally:
        runner.stop()


async def test_cpu_placed_runner_holds_no_vram(tiny_gguf, gpu: NvidiaGpu) -> None:
    """Even with a GPU named in the spec and a prompt long enough for llama.cpp to offload
    its matrix products, a CPU load never creates a CUDA context."""
    spec = LoadSpec(model_path=str(tiny_gguf()), name="tiny", num_gpu=0, gpu_ids=(gpu.uuid,))
    nvml = NvmlDevices()
    with trio.fail_after(TIMEOUT):
        async with ProcessEngineFactory().open(spec) as engine:
            assert engine.pid is not None
            assert engine.memory.vram_by_gpu == {}
            request = CompletionRequest(prompt="word " * 300, options={"num_predict": 4})
            async with engine.complete(request) as chunks:
                assert [c async for c in chunks][-1].done
            assert await nvml.vram_used_by_pid(engine.pid) == {}


async def test_probe_sees_the_nvidia_gpus(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ollamatrio")
    with trio.fail_after(TIMEOUT):
        report = await probe_engine()
        devices = await engine_device_source(Settings(engine="process"))
        inventory = await devices.inventory()
    assert len(report.gpus("CUDA")) == len(inventory.gpus) > 0
    assert isinstance(devices, NvmlDevices)  # the GPUs are kept
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(r.getMessage().startswith("engine: ") and "CUDA (" in r.getMessage()
               for r in caplog.records)  # fmt: skip


async def test_scheduler_loads_on_the_gpu_and_says_so(tiny_gguf) -> None:
    nvml = NvmlDevices()
    uuids = {g.uuid for g in nvidia_gpus()}
    model = ModelRequest(name="tiny", model_path=str(tiny_gguf()), keep_alive=0)
    settings = Settings()
    with trio.fail_after(TIMEOUT):
        async with open_scheduler(
            settings, engines=ProcessEngineFactory(settings), devices=nvml
        ) as sched:
            async with sched.lease(model) as lease:
                pid = lease.engine.pid
                assert pid is not None
                request = CompletionRequest(prompt="hello", options={"num_predict": 4})
                async with lease.engine.complete(request) as chunks:
                    assert [c async for c in chunks][-1].eval_count == 4
                (info,) = sched.ps()
                assert info.size_vram > 0
                assert set(info.vram_by_gpu) <= uuids
                measured = await nvml.vram_used_by_pid(pid)
                assert set(measured) == set(info.vram_by_gpu)
            await sched.wait_idle()  # keep_alive 0: unloaded
        assert await nvml.vram_used_by_pid(pid) == {}
