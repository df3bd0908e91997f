"""The scheduler: leases, keep-alive, placement, eviction and the queue."""

from .runner import RunnerInfo as RunnerInfo
from .scheduler import Lease as Lease
from .scheduler import ModelRequest as ModelRequest
from .scheduler import Scheduler as Scheduler
from .scheduler import open_scheduler as open_scheduler

__all__ = ["Lease", "ModelRequest", "RunnerInfo", "Scheduler", "open_scheduler"]
