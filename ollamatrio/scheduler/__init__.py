"""The scheduler: leases, keep-alive, placement, eviction and the queue.

``scheduler.py`` holds the front (admission, leases, the placement pass); ``admission.py``
the records it trades in; ``fair_queue.py`` a runner's slots, shared fairly between
principals; ``policy.py`` the placement and eviction decisions;
``runner_task.py`` each runner's life; ``vram_recovery.py`` the wait for a stopped
runner's VRAM; ``runner.py`` one resident model's state; ``placement.py`` where a model
goes on given devices; ``options.py`` load options; ``events.py`` the event stream.
"""

from .admission import Lease as Lease
from .admission import ModelRequest as ModelRequest
from .runner import RunnerInfo as RunnerInfo
from .scheduler import Scheduler as Scheduler
from .scheduler import default_cpu_elsewhere as default_cpu_elsewhere
from .scheduler import open_scheduler as open_scheduler

__all__ = ["Lease", "ModelRequest", "RunnerInfo", "Scheduler", "open_scheduler"]
