"""Step timing (``core/step_timer.py``) on the host clock: the wait before a step, its duration, gaps skipped
where validation or an epoch end ran in them."""

from __future__ import annotations

import math
import time

from lightning_gpu_boost.core.step_timer import StepTimer


def test_host_waits_and_steps_and_a_skipped_gap():
    timer = StepTimer(cuda=False)
    for step in range(3):
        if step == 2:
            timer.skip_next_gap()
        time.sleep(0.02)  # the wait for the batch
        timer.step_start()
        time.sleep(0.01)  # the step
        timer.step_end(step)
    first, second, third = timer.pop_ready()
    assert math.isnan(first.host_wait_ms) and math.isnan(third.host_wait_ms)  # no gap before, or a skipped one
    assert 15 <= second.wait_ms < 200 and 5 <= second.busy_ms < 200
    assert [t.step for t in (first, second, third)] == [0, 1, 2] and timer.pop_ready() == []
