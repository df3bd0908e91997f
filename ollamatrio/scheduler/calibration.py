"""Learning from measurement: a per-GPU correction of the VRAM prediction.

After each load the scheduler compares what the runner really holds on each GPU (NVML, per
process) with what the placement predicted, and keeps a correction factor per GPU that later
placements on that GPU apply to the model's part of the prediction (weights, KV cache,
graph; the fixed GPU context reserve is not scaled).  It is quick to book more and slow to
book less: an under-prediction is adopted at once (it is what turns into an out-of-memory
error), an over-prediction only halfway (it merely wastes room).  The factor stays within
bounds so one odd measurement cannot make a GPU look full or free.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

from .placement import Placement

log = logging.getLogger(__name__)

FACTOR_MIN: Final = 0.9
FACTOR_MAX: Final = 1.5
#: A GPU share smaller than this says more about measurement noise than about the model.
MIN_SAMPLE_BYTES: Final = 256 << 20
#: How far an over-prediction moves the factor towards what was measured.
RELAX: Final = 0.5


class VramCalibration:
    """Correction factors by GPU id; 1.0 for a GPU no load has been measured on."""

    def __init__(self) -> None:
        self._factors: dict[str, float] = {}

    def factor(self, gpu_id: str) -> float:
        return self._factors.get(gpu_id, 1.0)

    @property
    def factors(self) -> Mapping[str, float]:
        return dict(self._factors)

    def observe(self, placement: Placement, measured: Mapping[str, int], name: str = "") -> None:
        """Fold one load's measurement in.  GPUs the runner was not measured on are skipped
        (NVML may not report per-process usage, e.g. inside some containers)."""
        for gpu_id, predicted in placement.vram_by_gpu.items():
            used = measured.get(gpu_id)
            reserve = placement.reserve_by_gpu.get(gpu_id, 0)
            model_part = predicted - reserve
            if used is None or used <= 0 or model_part < MIN_SAMPLE_BYTES:
                continue
            # The placement predicted model_part = raw * assumed; the load showed the raw
            # model part really costs (used - reserve), i.e. a factor of target.
            assumed = placement.factor_by_gpu.get(gpu_id, 1.0)
            target = assumed * max(0, used - reserve) / model_part
            old = self.factor(gpu_id)
            new = target if target > old else old + RELAX * (target - old)
            new = min(FACTOR_MAX, max(FACTOR_MIN, new))
            self._factors[gpu_id] = new
            if abs(new - old) >= 0.01:
                log.info(
                    "VRAM prediction for %s on %s was %+.1f%% off (predicted %d MiB, measured "
                    "%d MiB); correction for this GPU now %.3f",
                    name or "a model",
                    gpu_id,
                    100 * (predicted - used) / used,
                    predicted >> 20,
                    used >> 20,
                    new,
                )
