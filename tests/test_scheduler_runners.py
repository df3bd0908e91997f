"""The scheduler with real runner subprocesses (llama.cpp) on tiny generated models."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import psutil
import pytest
import trio

from ollamatrio.config import Settings
from ollamatrio.devices import SimulatedDevices
from ollamatrio.engines.process import ProcessEngineFactory
from ollamatrio.errors import RunnerCrashedError, RunnerStartError
from ollamatrio.scheduler import ModelRequest, open_scheduler
from ollamatrio.types import CompletionRequest

TIMEOUT = 60


def cpu_only() -> SimulatedDevices:
    return SimulatedDevices('{"gpus": [], "system": {"total": "16GiB"}}')


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def generate(lease, prompt: str = "hello", n: int = 8) -> str:
    request = CompletionRequest(prompt=prompt, options={"num_predict": n, "temperature": 0})
    async with lease.engine.complete(request) as chunks:
        return "".join([c.content async for c in chunks])


async def test_load_generate_expire_and_no_process_left(tiny_gguf):
    model = ModelRequest(name="tiny", model_path=str(tiny_gguf()), keep_alive=0.5)
    settings = replace(Settings(), keep_alive=0.5)
    with trio.fail_after(TIMEOUT):
        async with open_scheduler(
            settings, engines=ProcessEngineFactory(settings), devices=cpu_only()
        ) as sched:
            async with sched.lease(model) as lease:
                pid = lease.engine.pid
                assert pid is not None
                assert alive(pid)
                assert lease.load_duration > 0
                text = await generate(lease)
                assert text
                (info,) = sched.ps()
                assert info.size > 0
                assert info.size_vram == 0
                assert info.pid == pid
            await sched.wait_idle()  # keep-alive 0.5 s passes, the runner unloads
            assert sched.ps() == []
            assert not alive(pid)


async def test_shutdown_leaves_no_runner_process(tiny_gguf):
    paths = [tiny_gguf(), tiny_gguf(dtype="q8_0")]
    with trio.fail_after(TIMEOUT):
        async with open_scheduler(
            Settings(), engines=ProcessEngineFactory(Settings()), devices=cpu_only()
        ) as sched:
            pids = []
            for i, path in enumerate(paths):
                async with sched.lease(ModelRequest(name=f"m{i}", model_path=str(path))) as lease:
                    pids.append(lease.engine.pid)
            assert all(alive(p) for p in pids)
    assert not any(alive(p) for p in pids)


async def test_runner_killed_mid_stream_reaches_leaseholder_and_reloads(tiny_gguf):
    model = ModelRequest(name="tiny", model_path=str(tiny_gguf()))
    with trio.fail_after(TIMEOUT):
        async with open_scheduler(
            Settings(), engines=ProcessEngineFactory(Settings()), devices=cpu_only()
        ) as sched:
            with pytest.raises(RunnerCrashedError, match="SIGKILL"):
                async with sched.lease(model) as lease:
                    first_pid = lease.engine.pid
                    request = CompletionRequest(
                        prompt="count", options={"num_predict": 100000, "ignore_eos": True}
                    )
                    async with lease.engine.complete(request) as chunks:
                        async for _ in chunks:
                            os.kill(first_pid, signal.SIGKILL)
            await sched.wait_idle()  # the crashed runner is dropped
            async with sched.lease(model) as lease:
                assert lease.engine.pid != first_pid
                assert await generate(lease)


async def test_model_that_aborts_on_load_gives_signal_and_scheduler_survives(tiny_gguf):
    bad = ModelRequest(name="bad", model_path=str(tiny_gguf(corrupt="duplicate_tokens")))
    good = ModelRequest(name="good", model_path=str(tiny_gguf()))
    with trio.fail_after(TIMEOUT):
        async with open_scheduler(
            Settings(), engines=ProcessEngineFactory(Settings()), devices=cpu_only()
        ) as sched:
            with pytest.raises(RunnerStartError, match="SIGABRT"):
                await sched.load(bad)
            assert sched.ps() == []
            async with sched.lease(good) as lease:
                assert await generate(lease)
