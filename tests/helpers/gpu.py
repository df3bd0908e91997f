"""Whether this machine can run the ``gpu``-marked tests: an NVIDIA GPU (NVML) and a CUDA
build of xllamacpp.  Both are asked once per session; the engine in a probe process, never
in the test process (a CUDA context would hold VRAM for the whole session)."""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass

import pynvml

from ollamatrio.engines.capability import EngineProbeError, parse_probe_output, probe_env

PROBE_TIMEOUT = 120


@dataclass(frozen=True)
class NvidiaGpu:
    uuid: str
    name: str
    total: int
    free: int


def nvidia_gpus() -> list[NvidiaGpu]:
    """Every GPU NVML lists (empty without NVML)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            uuid, name = pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle)
            gpus.append(
                NvidiaGpu(
                    uuid if isinstance(uuid, str) else uuid.decode(),
                    name if isinstance(name, str) else name.decode(),
                    int(memory.total),
                    int(memory.free),
                )
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


@functools.cache
def no_cuda_reason() -> str | None:
    """Why the GPU tests cannot run here, or None when they can."""
    if not nvidia_gpus():
        return "no NVIDIA GPU (NVML lists none)"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ollamatrio.runner.probe"],
            capture_output=True,
            env=probe_env(),
            timeout=PROBE_TIMEOUT,
            check=False,
        )
        report = parse_probe_output(done.stdout.decode(errors="replace"))
    except (EngineProbeError, subprocess.TimeoutExpired) as exc:
        return f"cannot probe the engine: {exc}"
    if not report.gpus("CUDA"):
        return f"the installed engine has no CUDA device ({report.describe()})"
    return None
