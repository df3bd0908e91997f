"""Which GPUs a CUDA program sees under ``CUDA_VISIBLE_DEVICES``, read as the CUDA runtime
reads it."""

from __future__ import annotations

import re
from collections.abc import Sequence


def select_visible(uuids: Sequence[str], visible: str | None) -> list[int]:
    """NVML indexes a CUDA program sees under ``CUDA_VISIBLE_DEVICES``, in its order.

    Entries are indexes or (prefixes of) UUIDs, with or without "GPU-".  As in the CUDA
    runtime, the list ends at the first entry that is empty, unknown, ambiguous or repeated,
    so "" and "-1" hide every device.  MIG entries are not supported and end the list too.
    """
    if visible is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for raw in visible.split(","):
        entry = raw.strip().lower()
        if re.fullmatch(r"-?\d+", entry):
            matches = [int(entry)] if 0 <= int(entry) < len(uuids) else []
        else:
            prefixes = (entry, f"gpu-{entry}") if entry else ()
            matches = [i for i, u in enumerate(uuids) if u.lower().startswith(prefixes)]
        if len(matches) != 1 or matches[0] in chosen:
            break
        chosen.append(matches[0])
    return chosen
