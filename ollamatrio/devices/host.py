"""Host memory and CPUs as this process may use them: psutil's figures capped by the tightest
cgroup memory limit (v1 or v2) over the process, and its CPU affinity."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import psutil

from .inventory import SystemMemory

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
# cgroup v1 reports "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 on 4 KiB pages).
_UNLIMITED_FLOOR = 1 << 62


def read_system_memory(
    cgroup_root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP
) -> SystemMemory:
    """Host RAM from psutil, capped by the tightest cgroup memory limit over this process."""
    vm = psutil.virtual_memory()
    total, free = vm.total, vm.available
    cap = cgroup_memory_cap(cgroup_root, _read_text(proc_self_cgroup) or "")
    if cap is not None:
        limit, headroom = cap
        total, free = min(total, limit), min(free, headroom)
    return SystemMemory(
        total=total, free=max(0, free), swap_free=psutil.swap_memory().free, cpu_count=cpu_count()
    )


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return psutil.cpu_count() or 1


def usable_cores(cgroup_root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> int:
    """Physical cores this process may keep busy: the CPUs of its affinity, counted as cores
    (hyperthread siblings share one: llama.cpp's default is a thread per core), within the
    tightest cgroup CPU quota over it."""
    logical = psutil.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or logical
    cores = max(1, physical * cpu_count() // logical)
    quota = cgroup_cpu_quota(cgroup_root, _read_text(proc_self_cgroup) or "")
    return max(1, min(cores, quota)) if quota is not None else cores


def cgroup_cpu_quota(root: Path, membership: str) -> int | None:
    """Whole CPUs the tightest cgroup CPU quota over this process allows (rounded up), or
    None without one.  ``membership`` is the text of ``/proc/self/cgroup``."""
    quotas = []
    for level, v2 in _cgroup_levels(root, membership, "cpu"):
        if v2:
            fields = (_read_text(level / "cpu.max") or "").split()
            if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
                quotas.append(int(fields[0]) / max(1, int(fields[1])))
        else:
            quota = _read_int(level / "cpu.cfs_quota_us")  # -1: none
            period = _read_int(level / "cpu.cfs_period_us")
            if quota is not None and period and quota > 0:
                quotas.append(quota / period)
    return math.ceil(min(quotas)) if quotas else None


def cgroup_memory_cap(root: Path, membership: str) -> tuple[int, int] | None:
    """``(limit, headroom)`` of the tightest memory limit on this process, None if unlimited.

    ``membership`` is the text of ``/proc/self/cgroup``.  Every level from the process's own
    cgroup up to ``root`` counts, since a parent's limit binds its children.  Headroom is the
    limit minus usage, not counting inactive page cache (the kernel reclaims it first).
    """
    caps = [cap for cap in map(_level_cap, _cgroup_levels(root, membership)) if cap is not None]
    if not caps:
        return None
    return min(limit for limit, _ in caps), min(headroom for _, headroom in caps)


def _cgroup_levels(
    root: Path, membership: str, controller: str = "memory"
) -> Iterator[tuple[Path, bool]]:
    """Directories (deepest first) holding this process's ``controller``, with is-v2."""
    v2 = (root / "cgroup.controllers").exists()
    base = root if v2 else root / controller
    relative = ""
    for line in membership.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if (v2 and controllers == "") or (not v2 and controller in controllers.split(",")):
            relative = path.strip().strip("/")
            break
    own = base / relative if relative else base
    if not own.is_dir():  # a container sees its own cgroup as the mount root
        own = base
    for level in (own, *own.parents):
        yield level, v2
        if level == base or not level.is_relative_to(base):
            break


def _level_cap(level: tuple[Path, bool]) -> tuple[int, int] | None:
    directory, v2 = level
    if v2:
        limit_file, usage_file, inactive_key = "memory.max", "memory.current", "inactive_file"
    else:
        limit_file, usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
        inactive_key = "total_inactive_file"
    limit = _read_int(directory / limit_file)
    if limit is None or limit >= _UNLIMITED_FLOOR:
        return None
    usage = _read_int(directory / usage_file) or 0
    inactive = _memory_stat(directory / "memory.stat").get(inactive_key, 0)
    return limit, max(0, limit - max(0, usage - inactive))


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = (_read_text(path) or "").strip()
    return int(text) if text.isdigit() else None  # "max" and missing files: no limit


def _memory_stat(path: Path) -> dict[str, int]:
    stats: dict[str, int] = {}
    for line in (_read_text(path) or "").splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            stats[key] = int(value)
    return stats
