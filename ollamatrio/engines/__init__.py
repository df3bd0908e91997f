"""Engines: what hosts a loaded model (a llama.cpp runner process, or a simulation)."""

from __future__ import annotations

from ..config import Settings
from ..devices import DeviceSource, SimulatedDevices
from .protocol import EngineFactory


def default_engine_factory(settings: Settings, devices: DeviceSource) -> EngineFactory:
    """The engine the settings ask for: runner subprocesses, or the simulation."""
    if settings.engine == "simulated":
        from .simulated import SimulatedEngineFactory, behaviours_from_json

        default, models = behaviours_from_json(settings.simulated_engine)
        sim = devices if isinstance(devices, SimulatedDevices) else None
        return SimulatedEngineFactory(sim, default=default, models=models)
    from .process import ProcessEngineFactory

    return ProcessEngineFactory(settings)
