"""ollamatrio: an Ollama-compatible model server built on Trio.

The embedding surface is re-exported here and imported lazily, so that the runner
subprocess (which also imports this package) pays for none of it.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__ as __version__

_EXPORTS = {
    "Settings": "ollamatrio.config",
    "open_scheduler": "ollamatrio.scheduler",
    "Scheduler": "ollamatrio.scheduler",
    "ModelRequest": "ollamatrio.scheduler",
    "Lease": "ollamatrio.scheduler",
    "RunnerInfo": "ollamatrio.scheduler",
    "create_app": "ollamatrio.api",
    "serve": "ollamatrio.serve",
    "run_server": "ollamatrio.serve",
    "CompletionRequest": "ollamatrio.types",
    "Chunk": "ollamatrio.types",
    "Message": "ollamatrio.types",
    "ToolCall": "ollamatrio.types",
    "OllamatrioError": "ollamatrio.errors",
    "InvalidRequestError": "ollamatrio.errors",
    "ModelNotFoundError": "ollamatrio.errors",
    "CapabilityError": "ollamatrio.errors",
    "QueueFullError": "ollamatrio.errors",
    "RunnerError": "ollamatrio.errors",
    "RunnerStartError": "ollamatrio.errors",
    "RunnerCrashedError": "ollamatrio.errors",
    "OutOfMemoryError": "ollamatrio.errors",
    "InsufficientMemoryError": "ollamatrio.errors",
    "SchedulerClosedError": "ollamatrio.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ollamatrio' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
