"""``core/worker_cpu.py``: the CPU share of this process's children, read from /proc."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from lightning_gpu_boost.core.worker_cpu import WorkerCPU, children_cpu_s

pytestmark = pytest.mark.skipif(children_cpu_s() is None, reason="/proc lists no children here")


@pytest.mark.timing
def test_a_busy_child_reads_busy_and_a_sleeping_one_idle():
    meter = WorkerCPU()
    spin = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        assert child.pid in (children_cpu_s() or {})
        meter.busy_share(1)
        time.sleep(1.0)
        busy = meter.busy_share(1)  # a spinning child: what the scheduler gives it, a fair share on a busy machine
    finally:
        child.wait()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    try:
        time.sleep(0.6)  # past its start-up (its imports use a CPU)
        meter.busy_share(1)
        time.sleep(1.0)
        idle = meter.busy_share(1)
    finally:
        sleeper.wait()
    # the sleeping child reads idle whatever the load; the spinning one reads busy: a tenth of a CPU at least (two
    # CPUs shared with the suite's workers and two CPU hogs still give it a third), and ten times the sleeper's
    assert busy > 0.1 and idle < 0.05 and busy > 10 * idle, (busy, idle)
    assert meter.busy_share(0) is None


@pytest.mark.timing
def test_a_child_that_ends_between_readings_still_counts():
    """Workers that are not persistent end with each epoch: their CPU time between two readings counts once they
    have been waited for (``os.times()``), and what the earlier reading saw of them is not counted twice."""
    meter = WorkerCPU()
    spin = "import time\nend = time.time() + 1.2\nwhile time.time() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    time.sleep(0.3)
    meter.busy_share(1)  # sees the child part-way
    child.wait()  # it ends and is reaped before the next reading
    share = meter.busy_share(1)
    assert 0.1 < share <= 1.0, share  # most of a CPU alone, a fair share of one beside CPU hogs
    time.sleep(0.5)
    assert meter.busy_share(1) < 0.1  # nothing ran since: the ended child is not counted again
