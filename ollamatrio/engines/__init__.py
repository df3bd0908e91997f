"""Engines: what hosts a loaded model (a llama.cpp runner process, or a simulation).

``protocol.py`` is the contract.  The runner process engine is ``process.py``, put together
from ``spawn.py`` (folder, environment, process), ``handshake.py`` (configuration in, ready
line out), ``health.py`` (stderr tail, crash reports, the stall kill) and ``shutdown.py``
(SIGTERM, grace, SIGKILL); it talks to llama.cpp through ``runner_client.py`` (the API in
Ollama's terms), ``chunk_stream.py`` (one generation's chunks), ``runner_http.py`` (HTTP on
the socket) and ``llamacpp_wire.py`` (the JSON both ways).  ``simulated.py`` stands in for
it in tests, demos and benchmarks.

Imports stay inside the function: whoever imports the protocol alone must not pay for the
server-side modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Settings
    from ..devices import DeviceSource
    from .protocol import EngineFactory


def default_engine_factory(settings: Settings, devices: DeviceSource) -> EngineFactory:
    """The engine the settings ask for: runner subprocesses, or the simulation."""
    if settings.engine == "simulated":
        from ..devices import SimulatedDevices
        from .simulated import SimulatedEngineFactory, behaviours_from_json

        default, models = behaviours_from_json(settings.simulated_engine)
        sim = devices if isinstance(devices, SimulatedDevices) else None
        return SimulatedEngineFactory(sim, default=default, models=models)
    from .process import ProcessEngineFactory

    return ProcessEngineFactory(settings)
