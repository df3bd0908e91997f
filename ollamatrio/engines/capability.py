"""Which devices the installed engine can use, asked once at start-up.

NVML says which NVIDIA GPUs the machine has; whether the installed xllamacpp can drive them
depends on how it was built (the PyPI wheel is CPU-only).  :func:`probe_engine` asks the
engine in a short-lived process (``python -m ollamatrio.runner.probe``): the server itself
never initialises a GPU runtime, since a CUDA context would hold about 545 MB of VRAM for
the server's whole life.

:func:`engine_device_source` is what ``ollamatrio serve`` places models with.  It logs the
engine's backends once and compares them with NVML's GPUs.  With GPUs present but no CUDA
device in the engine, it logs one warning (pointing at README.md's GPU section) and reports
no GPUs, so every model is placed, booked and shown (``ps``) as running on the CPU, which
is where such an engine runs it.  GPUs the engine has but NVML does not list (an AMD GPU
with a ROCm build, say) get one warning too: ollamatrio discovers NVIDIA GPUs only.

A probe that crashes, takes longer than :data:`PROBE_TIMEOUT` or answers nonsense is logged
as a warning, and NVML's GPUs are trusted: a failed probe says nothing about GPU support,
runners import the same engine and report their own load errors, and hiding the GPUs on a
passing failure would move every model to the CPU without a word.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from ..devices import DeviceSource, GpuInfo, Inventory, device_source

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 60.0  # seconds; initialising CUDA on a many-GPU machine can take a while
GPU_HELP = 'see the "GPU" section of README.md for a CUDA build of xllamacpp'
GPU_TYPES = ("GPU", "IGPU")


class EngineProbeError(RuntimeError):
    """The probe process did not say which devices the engine can use."""


@dataclass(frozen=True)
class EngineDevice:
    """One llama.cpp backend device, as ``xllamacpp.get_device_info()`` lists it."""

    name: str  # "CUDA0", "Vulkan1", "CPU", ...
    description: str = ""
    type: str = "CPU"  # CPU | GPU | IGPU | ACCEL
    memory_total: int = 0
    memory_free: int = 0
    device_id: str = ""  # PCI bus id for GPUs

    @property
    def backend(self) -> str:
        """The backend the device belongs to: "CUDA0" → "CUDA"."""
        return self.name.rstrip("0123456789") or self.name


@dataclass(frozen=True)
class EngineReport:
    version: str
    devices: tuple[EngineDevice, ...]

    @property
    def backends(self) -> tuple[str, ...]:
        """Distinct backends, in llama.cpp's device order (GPUs first)."""
        return tuple(dict.fromkeys(d.backend for d in self.devices))

    def gpus(self, backend: str) -> tuple[EngineDevice, ...]:
        return tuple(d for d in self.devices if d.backend == backend and d.type in GPU_TYPES)

    def describe(self) -> str:
        """``xllamacpp 2026.10.11549, backends: CUDA (NVIDIA H100 80GB HBM3), CPU``."""
        parts = []
        for backend in self.backends:
            gpus = [d.description or d.name for d in self.gpus(backend)]
            parts.append(f"{backend} ({', '.join(gpus)})" if gpus else backend)
        return f"xllamacpp {self.version or '(unknown version)'}, backends: {', '.join(parts)}"


def parse_probe_output(text: str) -> EngineReport:
    """The report in the probe's last stdout line; :class:`EngineProbeError` if there is none."""
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise EngineProbeError(f"unreadable answer {text.strip()[-200:]!r}")
    if "error" in data:
        raise EngineProbeError(f"the engine failed to load: {data['error']}")
    try:
        devices = tuple(EngineDevice(**device) for device in data["devices"])
    except (KeyError, TypeError) as exc:
        raise EngineProbeError(f"unexpected answer {data!r}") from exc
    return EngineReport(version=str(data.get("version", "")), devices=devices)


def probe_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: ours) with this package importable, as runners get it."""
    result = dict(os.environ if env is None else env)
    result["GGML_NO_BACKTRACE"] = "1"  # no gdb attach on abort()
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding ollamatrio/
    result["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, result.get("PYTHONPATH", "")) if p
    )
    return result


async def probe_engine(
    *, python: str = sys.executable, env: Mapping[str, str] | None = None
) -> EngineReport:
    """Ask the installed engine, in a child process, which devices it can use.

    The child inherits ``env`` (default: ours), so it sees the GPUs that
    ``CUDA_VISIBLE_DEVICES`` leaves, as NVML discovery does.  Raises
    :class:`EngineProbeError` when it crashes or says nothing usable.  Bound it with a
    cancel scope: a cancelled probe is killed."""
    from .health import describe_exit

    done = await trio.run_process(
        [python, "-m", "ollamatrio.runner.probe"],
        stdin=subprocess.DEVNULL,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=probe_env(env),
    )
    try:
        return parse_probe_output(done.stdout.decode(errors="replace"))
    except EngineProbeError as exc:
        if done.returncode == 0:
            raise
        stderr = [line for line in done.stderr.decode(errors="replace").splitlines() if line]
        last = f": {stderr[-1].strip()}" if stderr else ""
        raise EngineProbeError(f"{exc}; {describe_exit(done.returncode)}{last}") from None


class WithoutGpus:
    """A device source that keeps ``inner``'s host memory and drops its GPUs."""

    def __init__(self, inner: DeviceSource) -> None:
        self.inner = inner

    async def inventory(self) -> Inventory:
        inventory = await self.inner.inventory()
        return Inventory(gpus=(), system=inventory.system)


def check_engine_devices(
    devices: DeviceSource, gpus: tuple[GpuInfo, ...], report: EngineReport
) -> DeviceSource:
    """``devices``, or :class:`WithoutGpus` when the engine cannot use any of ``gpus``.

    ``gpus`` are NVML's (NVIDIA, driven through CUDA), so only the engine's CUDA devices
    count: a Vulkan-only build could reach them too, but runners address GPUs through
    ``CUDA_VISIBLE_DEVICES`` and memory is booked per NVML device."""
    if not gpus:
        engine_gpus = [d for d in report.devices if d.type in GPU_TYPES]
        if engine_gpus:
            log.warning(
                "the engine can use %s, but ollamatrio finds GPUs only through NVML (NVIDIA), "
                "which lists none: every model will run on the CPU",
                ", ".join(f"{d.name} ({d.description})" for d in engine_gpus),
            )
        return devices
    usable = report.gpus("CUDA")
    names = ", ".join(sorted({g.name for g in gpus}))
    if not usable:
        log.warning(
            "the installed engine (%s) cannot use the %d NVIDIA GPU%s NVML reports (%s): "
            "every model will run on the CPU; %s",
            report.describe(),
            len(gpus),
            "" if len(gpus) == 1 else "s",
            names,
            GPU_HELP,
        )
        return WithoutGpus(devices)
    if len(usable) < len(gpus):
        log.warning(
            "the engine sees %d CUDA device%s but NVML reports %d GPUs (%s); "
            "check the CUDA installation",
            len(usable),
            "" if len(usable) == 1 else "s",
            len(gpus),
            names,
        )
    return devices


Probe = Callable[[], Awaitable[EngineReport]]


async def engine_device_source(
    settings: Settings, *, probe: Probe | None = None, background: trio.Nursery | None = None
) -> DeviceSource:
    """The device source ``ollamatrio serve`` places models with (see the module docstring).

    ``probe`` defaults to :func:`probe_engine`.  Simulated GPUs or the simulated engine leave
    nothing to compare: the plain :func:`~ollamatrio.devices.device_source` answer,
    without a probe.  With ``background``, a machine whose NVML lists no GPU gets its
    answer at once and the probe (a process importing the engine: a few tenths of a second)
    runs in that nursery: with no GPU to drop, it can only add its log lines."""
    devices = device_source(settings)
    if settings.engine != "process" or settings.simulated_gpus.strip():
        return devices
    if background is not None and not (await devices.inventory()).gpus:
        background.start_soon(_probed, devices, probe)
        return devices
    return await _probed(devices, probe)


async def _probed(devices: DeviceSource, probe: Probe | None) -> DeviceSource:
    """``devices`` after the probe (its answer logged), checked against the engine's."""
    with trio.move_on_after(PROBE_TIMEOUT) as scope:
        try:
            report = await (probe or probe_engine)()
        except EngineProbeError as exc:
            _probe_failed(str(exc))
            return devices
    if scope.cancelled_caught:
        _probe_failed(f"no answer within {PROBE_TIMEOUT:g} s")
        return devices
    log.info("engine: %s", report.describe())
    inventory = await devices.inventory()
    return check_engine_devices(devices, inventory.gpus, report)


def _probe_failed(reason: str) -> None:
    log.warning("could not ask the engine which devices it can use (%s); trusting NVML", reason)
