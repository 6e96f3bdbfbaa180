"""How busy a loader's workers are: the CPU time of this process's child processes, read from ``/proc``.

Steps that wait for data while the workers are busy on the CPU wait on decoding and transforms (more workers, or
cheaper samples, help); steps that wait while the workers are idle wait on I/O (a remote store's downloads, a slow
disk): more CPU does not help. Linux only; elsewhere every reading is ``None`` ("not measured").
"""

from __future__ import annotations

import os
import time

__all__ = ["WorkerCPU", "children_cpu_s"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def children_cpu_s(pid: int | None = None) -> dict[int, float] | None:
    """CPU seconds (user + system) of each child process of ``pid`` (this process by default), or ``None`` where
    ``/proc`` does not list children (not Linux, a kernel without ``/proc/<pid>/task/<tid>/children``)."""
    pid = os.getpid() if pid is None else pid
    kids: set[int] = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids.update(int(k) for k in f.read().split())
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
    except OSError:
        return None
    cpu: dict[int, float] = {}
    for kid in kids:
        try:
            with open(f"/proc/{kid}/stat") as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3, utime 14, stime 15
        cpu[kid] = (int(fields[11]) + int(fields[12])) / _TICK
    return cpu


class WorkerCPU:
    """The share of the workers' time spent on a CPU between two calls of :meth:`busy_share`.

    Example::

        >>> meter = WorkerCPU()
        >>> meter.busy_share(workers=2) is None  # the first call only starts the count
        True
    """

    def __init__(self) -> None:
        self._last: dict[int, float] | None = None
        self._reaped = 0.0
        self._at = 0.0

    def busy_share(self, workers: int) -> float | None:
        """CPU seconds the child processes used since the last call over ``workers`` x the seconds passed, in
        ``[0, 1]``; ``None`` on the first call, with no workers, or where ``/proc`` cannot say. A worker started
        since the last call counts all its CPU time; one that ended meanwhile (workers that are not persistent
        end with every epoch) counts its last stretch too, once it has been waited for: ``os.times()`` adds up
        the children that ended, less what the last call had already counted of each."""
        # no workers, no reading: the listing opens a file per thread of this process (dozens under CUDA)
        now, at = (children_cpu_s() if workers > 0 else None), time.monotonic()
        reaped = _reaped_cpu_s()
        last, since, reaped_before = self._last, self._at, self._reaped
        self._last, self._at, self._reaped = now, at, reaped
        if now is None or last is None or workers <= 0 or at <= since:
            return None
        used = sum(max(0.0, cpu - last.get(pid, 0.0)) for pid, cpu in now.items())
        gone = sum(cpu for pid, cpu in last.items() if pid not in now)  # counted last time, ended since
        used += max(0.0, reaped - reaped_before - gone)
        return min(1.0, used / (workers * (at - since)))


def _reaped_cpu_s() -> float:
    """CPU seconds of this process's children that ended and were waited for (``os.times()``)."""
    t = os.times()
    return t.children_user + t.children_system
