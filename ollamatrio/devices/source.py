"""Which device source a server uses: the simulation when the settings describe one, else
NVML."""

from __future__ import annotations

from typing import Protocol

from .inventory import Inventory
from .nvml import NvmlDevices
from .simulated import SimulatedDevices


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
