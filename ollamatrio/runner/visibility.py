"""Which GPUs a runner may touch, as the environment variables the GPU runtimes read.

The scheduler books memory only on the GPUs it gives a load (``LoadSpec.gpu_ids``).  A
runner that could see any other device would still take memory there: a CUDA build of
llama.cpp creates a CUDA context (about 545 MB of VRAM) even with no layer offloaded.  So
every runner gets all of these variables: a CPU-placed runner sees no device at all, and a
GPU-placed one sees exactly its NVIDIA GPUs (ollamatrio discovers GPUs through NVML, so
``gpu_ids`` are CUDA devices) and nothing through the other runtimes a multi-backend build
might also carry.

The runtimes read these variables when they initialise, so they must be in place before
``xllamacpp`` is imported: the client passes them in the runner's environment and the runner
applies them again from its config (see ``runner/__main__.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ollamatrio.types import LoadSpec

#: Values that hide every device.  CUDA's runtime ends its list at the first empty or
#: invalid entry; HIP and ROCr take an invalid index ("-1", as Ollama documents for
#: ROCR_VISIBLE_DEVICES); ggml-vulkan parses unsigned indexes and throws on "-1", but an
#: empty list selects no device.  SYCL's ONEAPI_DEVICE_SELECTOR has no "none" value and is
#: left alone.
HIDE_ALL: Final[Mapping[str, str]] = {
    "CUDA_VISIBLE_DEVICES": "",
    "HIP_VISIBLE_DEVICES": "-1",
    "ROCR_VISIBLE_DEVICES": "-1",
    "GGML_VK_VISIBLE_DEVICES": "",
}


def visible_devices_env(spec: LoadSpec) -> dict[str, str]:
    """The visibility variables for a runner loading ``spec``.

    ``num_gpu == 0`` or no ``gpu_ids``: every device hidden.  Otherwise ``gpu_ids`` (NVML
    UUIDs, in layout order) become ``CUDA_VISIBLE_DEVICES`` and the other runtimes stay hidden.
    """
    env = dict(HIDE_ALL)
    if spec.num_gpu != 0 and spec.gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.gpu_ids)
    return env
