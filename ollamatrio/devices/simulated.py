"""GPUs (and optionally host memory) that exist only in a JSON description, for tests and
benchmarks on machines without the hardware.

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
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from ..errors import OutOfMemoryError
from .host import cpu_count, read_system_memory
from .inventory import GpuInfo, Inventory, SystemMemory

SIMULATED_GPUS_VAR = "OLLAMATRIO_SIMULATED_GPUS"
LIBRARIES = ("CUDA", "ROCm", "Metal", "Vulkan")

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
