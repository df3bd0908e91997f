"""What the machine offers: GPUs (through NVML or a simulation) and host memory.

:func:`device_source` picks the source from the settings: :class:`SimulatedDevices` when
``OLLAMATRIO_SIMULATED_GPUS`` is set, else :class:`NvmlDevices`.  Both answer
``await source.inventory()`` with a fresh :class:`Inventory`; the scheduler decides what to do
with stale or missing values.

``OLLAMATRIO_SIMULATED_GPUS`` is JSON in one of two forms::

    [{"total": "24GiB"}, ...]                          # GPUs only; host memory is real
    {"gpus": [...], "system": {"total": "64GiB", ...}}  # GPUs and simulated host memory

GPU objects: ``total`` (required), ``id`` ("sim<N>"), ``library`` ("CUDA"; or "ROCm",
"Metal", "Vulkan"), ``name`` ("Simulated GPU <N>"), ``integrated`` (false), ``compute``
("8.0"), ``driver`` ("12.4"), ``reserved`` (0: bytes never free, as if another process held
them).  System object: ``total`` (required), ``free`` (= total), ``swap_free`` (0),
``cpu_count`` (the real one).  Sizes are byte counts or strings with a unit (B, KB, MB, GB,
TB, KiB, MiB, GiB, TiB; case-insensitive).  ``[]`` simulates a machine without GPUs.
Unknown keys are errors, so typos do not pass silently.

Bn codes in this module name Ollama's behaviours, each defined in docs/behaviours.md.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil
import pynvml
import trio

from .errors import OutOfMemoryError

log = logging.getLogger(__name__)

SIMULATED_GPUS_VAR = "OLLAMATRIO_SIMULATED_GPUS"
LIBRARIES = ("CUDA", "ROCm", "Metal", "Vulkan")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
# cgroup v1 reports "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 on 4 KiB pages).
_UNLIMITED_FLOOR = 1 << 62


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as discovered; ``id`` is its identity across refreshes."""

    id: str  # NVML uuid ("GPU-…") or simulated id ("sim0")
    index: int  # ordinal a runner sees (after CUDA_VISIBLE_DEVICES filtering)
    library: str  # CUDA | ROCm | Metal | Vulkan
    name: str
    total: int  # bytes
    free: int  # bytes
    integrated: bool
    compute: tuple[int, int]  # (major, minor)
    driver: tuple[int, int]  # (major, minor); for CUDA the CUDA driver API version (12.4)

    @property
    def supports_flash_attention(self) -> bool:
        """B62: CUDA needs compute ≥ 6.0 (not Jetson Xavier's 7.2) and a driver ≥ 7."""
        if self.library != "CUDA":
            return True
        return self.compute[0] >= 6 and self.compute != (7, 2) and self.driver[0] >= 7


@dataclass(frozen=True)
class SystemMemory:
    """Host memory in bytes, already capped by the process's cgroup limit."""

    total: int
    free: int  # available RAM (reclaimable cache counts as free)
    swap_free: int
    cpu_count: int  # CPUs this process may run on


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[GpuInfo, ...]
    system: SystemMemory

    @property
    def supports_flash_attention(self) -> bool:
        """B62: flash attention is only automatic when every GPU supports it."""
        return all(gpu.supports_flash_attention for gpu in self.gpus)


class DeviceSource(Protocol):
    async def inventory(self) -> Inventory: ...


class _HasSimulatedGpus(Protocol):
    @property
    def simulated_gpus(self) -> str: ...  # read-only, so frozen Settings match


def device_source(settings: _HasSimulatedGpus) -> DeviceSource:
    """The simulation when ``settings.simulated_gpus`` holds JSON, else the real NVML one."""
    if settings.simulated_gpus.strip():
        return SimulatedDevices(settings.simulated_gpus)
    return NvmlDevices()


# --------------------------------------------------------------------------- host memory


def read_system_memory(
    cgroup_root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> SystemMemory:
    """Host RAM from psutil, capped by the tightest cgroup memory limit over this process."""
    vm = psutil.virtual_memory()
    total, free = vm.total, vm.available
    cap = cgroup_memory_cap(cgroup_root, _read_text(proc_self_cgroup) or "")
    if cap is not None:
        limit, headroom = cap
        total, free = min(total, limit), min(free, headroom)
    return SystemMemory(
        total=total, free=max(0, free), swap_free=psutil.swap_memory().free, cpu_count=cpu_count()
    )


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return psutil.cpu_count() or 1


def cgroup_memory_cap(root: Path, membership: str) -> tuple[int, int] | None:
    """``(limit, headroom)`` of the tightest memory limit on this process, None if unlimited.

    ``membership`` is the text of ``/proc/self/cgroup``.  Every level from the process's own
    cgroup up to ``root`` counts, since a parent's limit binds its children.  Headroom is the
    limit minus usage, not counting inactive page cache (the kernel reclaims it first).
    """
    caps = [cap for cap in map(_level_cap, _cgroup_levels(root, membership)) if cap is not None]
    if not caps:
        return None
    return min(limit for limit, _ in caps), min(headroom for _, headroom in caps)


def _cgroup_levels(root: Path, membership: str) -> Iterator[tuple[Path, bool]]:
    """Directories (deepest first) holding this process's memory controller, with is-v2."""
    v2 = (root / "cgroup.controllers").exists()
    base = root if v2 else root / "memory"
    relative = ""
    for line in membership.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if (v2 and controllers == "") or (not v2 and "memory" in controllers.split(",")):
            relative = path.strip().strip("/")
            break
    own = base / relative if relative else base
    if not own.is_dir():  # a container sees its own cgroup as the mount root
        own = base
    for level in (own, *own.parents):
        yield level, v2
        if level == base or not level.is_relative_to(base):
            break


def _level_cap(level: tuple[Path, bool]) -> tuple[int, int] | None:
    directory, v2 = level
    if v2:
        limit_file, usage_file, inactive_key = "memory.max", "memory.current", "inactive_file"
    else:
        limit_file, usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
        inactive_key = "total_inactive_file"
    limit = _read_int(directory / limit_file)
    if limit is None or limit >= _UNLIMITED_FLOOR:
        return None
    usage = _read_int(directory / usage_file) or 0
    inactive = _memory_stat(directory / "memory.stat").get(inactive_key, 0)
    return limit, max(0, limit - max(0, usage - inactive))


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = (_read_text(path) or "").strip()
    return int(text) if text.isdigit() else None  # "max" and missing files: no limit


def _memory_stat(path: Path) -> dict[str, int]:
    stats: dict[str, int] = {}
    for line in (_read_text(path) or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            stats[key] = int(value)
    return stats


# --------------------------------------------------------------------------- NVML


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


def select_visible(uuids: Sequence[str], visible: str | None) -> list[int]:
    """NVML indexes a CUDA program sees under ``CUDA_VISIBLE_DEVICES``, in its order.

    Entries are indexes or (prefixes of) UUIDs, with or without "GPU-".  As in the CUDA
    runtime, the list ends at the first entry that is empty, unknown, ambiguous or repeated,
    so "" and "-1" hide every device.  MIG entries are not supported and end the list too.
    """
    if visible is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for raw in visible.split(","):
        entry = raw.strip().lower()
        if re.fullmatch(r"-?\d+", entry):
            matches = [int(entry)] if 0 <= int(entry) < len(uuids) else []
        else:
            prefixes = (entry, f"gpu-{entry}") if entry else ()
            matches = [i for i, u in enumerate(uuids) if u.lower().startswith(prefixes)]
        if len(matches) != 1 or matches[0] in chosen:
            break
        chosen.append(matches[0])
    return chosen


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --------------------------------------------------------------------------- simulation

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_GPU_KEYS = {"id", "library", "name", "total", "integrated", "compute", "driver", "reserved"}
_SYSTEM_KEYS = {"total", "free", "swap_free", "cpu_count"}


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as "80GiB", "1.5 GB", "512"."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        if match and match[2].lower() in _UNITS:
            return round(float(match[1]) * _UNITS[match[2].lower()])
    raise ValueError(f"not a size: {value!r} (use bytes or a number with B, MB, GiB…)")


def parse_version(value: object) -> tuple[int, int]:
    """(major, minor) from "8.6", "580.95.05", "12", 8 or [8, 6]."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value, 0
    if isinstance(value, list) and len(value) == 2 and all(type(v) is int for v in value):
        return value[0], value[1]
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)*", value.strip()):
        parts = [int(p) for p in value.strip().split(".")]
        return parts[0], parts[1] if len(parts) > 1 else 0
    raise ValueError(f'not a version: {value!r} (use a string like "8.6")')


@dataclass(frozen=True)
class SimulatedGpu:
    id: str
    library: str
    name: str
    total: int
    integrated: bool
    compute: tuple[int, int]
    driver: tuple[int, int]
    reserved: int


class SimulatedDevices:
    """GPUs (and optionally host memory) that exist only in a JSON description.

    Simulated engines register what they hold with :meth:`allocate` / :meth:`allocate_host`
    and give it all back with :meth:`release`; free memory is what the description leaves
    after reservations and registrations.  All methods run on the Trio thread.
    """

    def __init__(
        self,
        spec: str | Sequence[Any] | Mapping[str, Any],
        *,
        read_system: Callable[[], SystemMemory] = read_system_memory,
    ) -> None:
        self.gpus, self._system = _parse_spec(spec)
        self._read_system = read_system
        self._vram: dict[str, dict[str, int]] = {}  # owner -> gpu id -> bytes
        self._host: dict[str, int] = {}  # owner -> bytes

    async def inventory(self) -> Inventory:
        gpus = tuple(
            GpuInfo(
                id=gpu.id,
                index=index,
                library=gpu.library,
                name=gpu.name,
                total=gpu.total,
                free=self._gpu_free(gpu),
                integrated=gpu.integrated,
                compute=gpu.compute,
                driver=gpu.driver,
            )
            for index, gpu in enumerate(self.gpus)
        )
        held = sum(self._host.values())  # read before awaiting, so the snapshot is consistent
        system = self._system
        if system is None:
            system = await trio.to_thread.run_sync(self._read_system, abandon_on_cancel=True)
        return Inventory(
            gpus,
            SystemMemory(
                total=system.total,
                free=max(0, system.free - held),
                swap_free=system.swap_free,
                cpu_count=system.cpu_count,
            ),
        )

    def allocate(self, owner: str, gpu_id: str, nbytes: int) -> None:
        """Add ``nbytes`` to what ``owner`` holds on ``gpu_id``.

        Raises :class:`OutOfMemoryError` (recording nothing) when the GPU has less free,
        as a real allocation would fail.
        """
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        gpu = next((g for g in self.gpus if g.id == gpu_id), None)
        if gpu is None:
            raise ValueError(f"no simulated GPU {gpu_id!r}")
        free = self._gpu_free(gpu)
        if nbytes > free:
            raise OutOfMemoryError(
                f"{gpu_id}: out of memory allocating {nbytes} bytes ({free} free)"
            )
        held = self._vram.setdefault(owner, {})
        held[gpu_id] = held.get(gpu_id, 0) + nbytes

    def allocate_host(self, owner: str, nbytes: int) -> None:
        """Add ``nbytes`` of host RAM to ``owner``; never fails (host memory overcommits)."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        self._host[owner] = self._host.get(owner, 0) + nbytes

    def release(self, owner: str) -> None:
        """Forget everything ``owner`` holds; releasing twice is harmless."""
        self._vram.pop(owner, None)
        self._host.pop(owner, None)

    def usage(self, owner: str) -> dict[str, int]:
        """GPU id → bytes ``owner`` holds (like :meth:`NvmlDevices.vram_used_by_pid`)."""
        return dict(self._vram.get(owner, {}))

    def _gpu_free(self, gpu: SimulatedGpu) -> int:
        used = sum(held.get(gpu.id, 0) for held in self._vram.values())
        return max(0, gpu.total - gpu.reserved - used)


def _parse_spec(
    spec: str | Sequence[Any] | Mapping[str, Any],
) -> tuple[tuple[SimulatedGpu, ...], SystemMemory | None]:
    try:
        data = json.loads(spec) if isinstance(spec, str) else spec
        if isinstance(data, Mapping):
            _check_keys(data, {"gpus", "system"}, "top level")
            gpus_data, system_data = data.get("gpus", []), data.get("system")
        else:
            gpus_data, system_data = data, None
        if not isinstance(gpus_data, list):
            raise ValueError("expected a list of GPUs")
        gpus = tuple(_parse_gpu(i, g) for i, g in enumerate(gpus_data))
        ids = [gpu.id for gpu in gpus]
        if len(set(ids)) != len(ids):
            raise ValueError(f"GPU ids repeat: {ids}")
        system = None if system_data is None else _parse_system(system_data)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError too
        raise ValueError(f"invalid {SIMULATED_GPUS_VAR}: {exc}") from exc
    return gpus, system


def _parse_gpu(index: int, data: object) -> SimulatedGpu:
    if not isinstance(data, Mapping):
        raise ValueError(f"GPU {index}: expected an object, got {data!r}")
    _check_keys(data, _GPU_KEYS, f"GPU {index}")
    if "total" not in data:
        raise ValueError(f"GPU {index}: 'total' is required")
    library = data.get("library", "CUDA")
    if library not in LIBRARIES:
        raise ValueError(f"GPU {index}: library {library!r} is not one of {LIBRARIES}")
    total, reserved = parse_size(data["total"]), parse_size(data.get("reserved", 0))
    if reserved > total:
        raise ValueError(f"GPU {index}: reserved {reserved} exceeds total {total}")
    integrated = data.get("integrated", False)
    if not isinstance(integrated, bool):
        raise ValueError(f"GPU {index}: 'integrated' must be true or false")
    return SimulatedGpu(
        id=str(data.get("id", f"sim{index}")),
        library=library,
        name=str(data.get("name", f"Simulated GPU {index}")),
        total=total,
        integrated=integrated,
        compute=parse_version(data.get("compute", "8.0")),
        driver=parse_version(data.get("driver", "12.4")),
        reserved=reserved,
    )


def _parse_system(data: object) -> SystemMemory:
    if not isinstance(data, Mapping):
        raise ValueError(f"system: expected an object, got {data!r}")
    _check_keys(data, _SYSTEM_KEYS, "system")
    if "total" not in data:
        raise ValueError("system: 'total' is required")
    total = parse_size(data["total"])
    free = parse_size(data.get("free", total))
    if free > total:
        raise ValueError(f"system: free {free} exceeds total {total}")
    cpus = data.get("cpu_count", cpu_count())
    if type(cpus) is not int or cpus < 1:
        raise ValueError(f"system: cpu_count must be a positive integer, got {cpus!r}")
    return SystemMemory(total, free, parse_size(data.get("swap_free", 0)), cpus)


def _check_keys(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} (allowed: {sorted(allowed)})")
