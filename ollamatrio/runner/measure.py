"""What the runner really uses after load: host RSS/USS (psutil) and VRAM per GPU (NVML)."""

from __future__ import annotations

import os
from typing import Any

import psutil
import pynvml


def vram_by_gpu(pid: int) -> dict[str, int]:
    """GPU UUID -> bytes held by ``pid``; empty where NVML is missing or refuses."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    usage: dict[str, int] = {}
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError:
                continue
            used = sum(int(p.usedGpuMemory or 0) for p in processes if p.pid == pid)
            if used:
                usage[uuid if isinstance(uuid, str) else uuid.decode()] = used
    except pynvml.NVMLError:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return usage


def measure(pid: int | None = None) -> dict[str, Any]:
    """``{"rss", "uss", "vram_by_gpu"}`` for ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    info = psutil.Process(pid).memory_full_info()
    return {"rss": info.rss, "uss": info.uss, "vram_by_gpu": vram_by_gpu(pid)}


def cuda_gpu_facts(uuids: tuple[str, ...]) -> list[tuple[int, int, int]]:
    """(compute major, compute minor, driver major) of the given NVIDIA GPUs, where NVML works."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    facts = []
    try:
        driver_major = int(pynvml.nvmlSystemGetCudaDriverVersion()) // 1000  # 12020 -> 12
        for uuid in uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            except pynvml.NVMLError:
                continue
            facts.append((int(major), int(minor), driver_major))
    except pynvml.NVMLError:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return facts
