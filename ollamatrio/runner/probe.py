"""``python -m ollamatrio.runner.probe``: the devices the installed engine can use.

Prints one JSON line on stdout, ``{"version": ..., "devices": [...]}`` from
``xllamacpp.get_device_info()`` (one object per llama.cpp backend device: ``name`` such as
"CUDA0" or "CPU", ``description``, ``type`` one of CPU/GPU/IGPU/ACCEL, ``memory_total``,
``memory_free``, ``device_id``), or ``{"error": ...}`` and exit status 1.  Everything
llama.cpp itself prints goes to stderr.

The server runs this in a short-lived process (:mod:`ollamatrio.engines.capability`)
because asking initialises every GPU runtime the engine was built with, and a CUDA context
holds about 545 MB of VRAM until its process exits.  The import happens here, in the main
thread and with nothing but the standard library loaded: the CUDA build crashed (SIGSEGV)
imported after numpy on an H200, and was reported to when imported off the main thread.
"""

from __future__ import annotations

import json
import os
from typing import Any

_DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}  # ggml_backend_dev_type


def _device(props: dict[str, Any]) -> dict[str, Any]:
    kind = int(props.get("type", 0))  # an IntEnum: GGML_BACKEND_DEVICE_TYPE_GPU is 1
    return {
        "name": str(props.get("name", "")),
        "description": str(props.get("description", "")),
        "type": _DEVICE_TYPES.get(kind, str(kind)),
        "memory_total": int(props.get("memory_total") or 0),
        "memory_free": int(props.get("memory_free") or 0),
        "device_id": str(props.get("device_id") or ""),
    }


def main() -> None:
    protocol = os.dup(1)
    os.dup2(2, 1)  # llama.cpp's plain log lines must not mix with the one JSON line
    code = 1
    try:
        import xllamacpp

        devices = [_device(dict(props)) for props in xllamacpp.get_device_info()]
        result: dict[str, Any] = {
            "version": getattr(xllamacpp, "__version__", ""),
            "devices": devices,
        }
        code = 0
    except Exception as exc:  # ImportError, OSError from a missing runtime library, ...
        result = {"error": f"{type(exc).__name__}: {exc}"}
    os.write(protocol, (json.dumps(result, separators=(",", ":")) + "\n").encode())
    os._exit(code)  # skip the GPU runtimes' teardown: the kernel frees everything


if __name__ == "__main__":
    main()
