"""What the machine offers: GPUs (through NVML or a simulation) and host memory.

:func:`device_source` picks the source from the settings: :class:`SimulatedDevices` when
``OLLAMATRIO_SIMULATED_GPUS`` is set (its JSON is described in :mod:`.simulated`), else
:class:`NvmlDevices`.  Both answer ``await source.inventory()`` with a fresh
:class:`Inventory`; the scheduler decides what to do with stale or missing values.

The modules: :mod:`.inventory` (the records a source answers), :mod:`.host` (host memory and
CPUs under the cgroup limits), :mod:`.visibility` (``CUDA_VISIBLE_DEVICES``), :mod:`.nvml`
(real NVIDIA GPUs), :mod:`.simulated` (GPUs described in JSON) and :mod:`.source` (which of
the two a server uses).
"""

from .host import (
    cgroup_cpu_quota,
    cgroup_memory_cap,
    cpu_count,
    read_system_memory,
    usable_cores,
)
from .inventory import GpuInfo, Inventory, SystemMemory
from .nvml import NvmlDevices
from .simulated import SimulatedDevices, parse_size, parse_version
from .source import DeviceSource, device_source
from .visibility import select_visible

__all__ = [
    "DeviceSource",
    "GpuInfo",
    "Inventory",
    "NvmlDevices",
    "SimulatedDevices",
    "SystemMemory",
    "cgroup_cpu_quota",
    "cgroup_memory_cap",
    "cpu_count",
    "device_source",
    "parse_size",
    "parse_version",
    "read_system_memory",
    "select_visible",
    "usable_cores",
]
