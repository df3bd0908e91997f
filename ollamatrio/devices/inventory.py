"""What a device source answers: the GPUs it found and the host's memory, as one
:class:`Inventory`.

Bn codes in this module name Ollama's behaviours, each defined in docs/behaviours.md.
"""

from __future__ import annotations

from dataclasses import dataclass


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
