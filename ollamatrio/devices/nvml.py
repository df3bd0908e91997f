"""Real NVIDIA GPUs through NVML, listed as a runner's CUDA runtime sees them, and the GPU
memory a process holds.

Bn codes in this module name Ollama's behaviours, each defined in docs/behaviours.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pynvml
import trio

from .host import read_system_memory
from .inventory import GpuInfo, Inventory, SystemMemory
from .visibility import select_visible

# The package's name, the one log settings and readers of the log know these lines by.
log = logging.getLogger("ollamatrio.devices")


@dataclass(frozen=True)
class _Probe:
    gpus: tuple[GpuInfo, ...]
    notes: tuple[tuple[int, str], ...]  # (logging level, message), logged once by the caller


class NvmlDevices:
    """Real NVIDIA GPUs through NVML; a machine without NVML is simply CPU only.

    Each call opens and closes NVML (it is reference counted) in a worker thread, since
    every NVML call blocks.  Devices are listed as the CUDA runtime of a runner would see
    them under ``CUDA_VISIBLE_DEVICES``; a device whose query fails is left out with a warning.
    """

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        read_system: Callable[[], SystemMemory] = read_system_memory,
    ) -> None:
        self._env = env
        self._read_system = read_system
        self._logged: set[str] = set()

    async def inventory(self) -> Inventory:
        visible = (os.environ if self._env is None else self._env).get("CUDA_VISIBLE_DEVICES")
        probe, system = await trio.to_thread.run_sync(
            self._probe_all, visible, abandon_on_cancel=True
        )
        self._log_once(probe.notes)
        return Inventory(gpus=probe.gpus, system=system)

    async def vram_used_by_pid(self, pid: int) -> dict[str, int]:
        """GPU memory held by process ``pid``: GPU id → bytes (empty without NVML)."""
        usage, notes = await trio.to_thread.run_sync(
            _nvml_usage_by_pid, pid, abandon_on_cancel=True
        )
        self._log_once(notes)
        return usage

    def _probe_all(self, visible: str | None) -> tuple[_Probe, SystemMemory]:
        return _probe_nvml(visible), self._read_system()

    def _log_once(self, notes: Iterable[tuple[int, str]]) -> None:
        for level, message in notes:
            if message not in self._logged:
                self._logged.add(message)
                log.log(level, message)


def _nvml_open(notes: list[tuple[int, str]]) -> bool:
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as exc:
        notes.append((logging.INFO, f"no NVIDIA GPU: NVML unavailable ({exc}); using CPU only"))
        return False
    except pynvml.NVMLError as exc:
        notes.append((logging.WARNING, f"NVML failed to initialise ({exc}); using CPU only"))
        return False
    return True


def _nvml_close(notes: list[tuple[int, str]]) -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        notes.append((logging.WARNING, f"NVML shutdown failed: {exc}"))


def _probe_nvml(visible: str | None) -> _Probe:
    notes: list[tuple[int, str]] = []
    if not _nvml_open(notes):
        return _Probe((), tuple(notes))
    gpus: list[GpuInfo] = []
    try:
        handles = _nvml_handles(notes)
        driver = _cuda_driver_version(notes)
        uuids = [uuid for uuid, _ in handles]
        for ordinal, nvml_index in enumerate(select_visible(uuids, visible)):
            uuid, handle = handles[nvml_index]
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                name = _text(pynvml.nvmlDeviceGetName(handle))
            except pynvml.NVMLError as exc:
                notes.append((logging.WARNING, f"skipping GPU {uuid}: NVML query failed ({exc})"))
                continue
            gpus.append(
                GpuInfo(
                    id=uuid,
                    index=ordinal,
                    library="CUDA",
                    name=name,
                    total=int(memory.total),
                    free=int(memory.free),
                    integrated=False,  # NVML does not say; Jetson boards have no NVML
                    compute=(int(major), int(minor)),
                    driver=driver,
                )
            )
    finally:
        _nvml_close(notes)
    return _Probe(tuple(gpus), tuple(notes))


def _nvml_handles(notes: list[tuple[int, str]]) -> list[tuple[str, Any]]:
    """(uuid, handle) per NVML index; empty when NVML cannot even count its devices."""
    try:
        handles = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            handles.append((_text(pynvml.nvmlDeviceGetUUID(handle)), handle))
    except pynvml.NVMLError as exc:
        notes.append((logging.WARNING, f"NVML cannot list GPUs ({exc}); using CPU only"))
        return []
    return handles


def _cuda_driver_version(notes: list[tuple[int, str]]) -> tuple[int, int]:
    """The CUDA driver API version (12040 → (12, 4)), which is what B62's "driver ≥ 7" means."""
    for query in (pynvml.nvmlSystemGetCudaDriverVersion_v2, pynvml.nvmlSystemGetCudaDriverVersion):
        try:
            version = int(query())
        except pynvml.NVMLError:
            continue
        return version // 1000, version % 1000 // 10
    # Unknown counts as too old: flash attention stays off rather than crashing a runner.
    notes.append((logging.WARNING, "NVML does not report the CUDA driver version"))
    return 0, 0


def _nvml_usage_by_pid(pid: int) -> tuple[dict[str, int], tuple[tuple[int, str], ...]]:
    notes: list[tuple[int, str]] = []
    if not _nvml_open(notes):
        return {}, tuple(notes)
    usage: dict[str, int] = {}
    try:
        for uuid, handle in _nvml_handles(notes):
            try:
                processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError as exc:
                notes.append((logging.WARNING, f"NVML cannot list processes on {uuid}: {exc}"))
                continue
            used = [p.usedGpuMemory for p in processes if p.pid == pid]
            # usedGpuMemory is None where the driver cannot attribute memory (e.g. WDDM).
            total = sum(int(n) for n in used if n is not None)
            if total:
                usage[uuid] = total
    finally:
        _nvml_close(notes)
    return usage, tuple(notes)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
