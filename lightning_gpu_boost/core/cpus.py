"""How many CPUs this process may really use, and a worker count derived from it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ['default_num_workers', 'processes_per_node', 'usable_cpus']


def _cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPU quota of this container in CPUs (cgroup v2 ``cpu.max`` or v1 ``cfs_quota/period``), ``None`` if unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        if quota_us > 0 and period_us > 0:
            return quota_us / period_us
    except (OSError, ValueError):
        pass
    return None


def usable_cpus() -> int:
    """CPUs this process may run on: the affinity mask, capped by the cgroup quota (at least 1)."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        count = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        count = min(count, max(1, int(limit)))
    return max(1, count)


def processes_per_node(trainer: Any = None) -> int:
    """Processes sharing this node's CPUs: a Trainer's devices on the node where it runs several processes (one
    where it runs one), else the launcher's environment (torchrun, SLURM). Lightning's own launcher of
    ``Trainer(devices=N)`` sets no ``LOCAL_WORLD_SIZE``: pass the Trainer wherever there is one."""
    if trainer is not None:
        return max(1, trainer.num_devices) if trainer.world_size > 1 else 1
    for var in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def default_num_workers(procs_per_node: int | None = None, reserve: int = 1) -> int:
    """A DataLoader worker count from the usable CPUs, shared among the node's processes.

    Each process keeps ``reserve`` CPUs for its own main thread (which runs the training loop and
    launches GPU work), so the count is ``usable_cpus() // procs_per_node - reserve``, at least 0.
    """
    procs = procs_per_node or processes_per_node()
    return max(0, usable_cpus() // max(1, procs) - reserve)
