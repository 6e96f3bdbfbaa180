"""Step timing (``core/step_timer.py``) on the host clock: the wait before a step, its duration, gaps skipped
where validation or an epoch end ran in them."""

from __future__ import annotations

import math
import time

import pytest

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


@pytest.mark.gpu
def test_cuda_gaps_and_steps_with_events_reused():
    """On CUDA the GPU's idle gap before a step and the step's own time come from events on the step's stream
    (looked up once), and the events are recorded again once read: a long run creates a handful, not two a step."""
    import torch

    timer, x = StepTimer(cuda=True), torch.randn(2048, 2048, device="cuda")
    timings, created = [], set()
    for step in range(40):
        time.sleep(0.005)  # the host fetches the next batch: the GPU idles
        timer.step_start()
        for _ in range(4):
            x = torch.tanh(x @ x)
        timer.step_end(step)
        created.update(id(e) for e in (timer._start_event, timer._last_end_event))
        timings += timer.pop_ready()
    torch.cuda.synchronize()
    timings += timer.pop_ready()
    assert [t.step for t in timings] == list(range(40))
    assert all(t.gpu_step_ms > 0 for t in timings)
    assert all(t.gpu_gap_ms >= 0 for t in timings[1:]) and math.isnan(timings[0].gpu_gap_ms)
    assert len(created) < 20  # reused (40 steps record 80 events)


def test_read_every_is_checked():
    with pytest.raises(ValueError, match="read_every must be an int >= 1, got 0"):
        StepTimer(cuda=False, read_every=0)


@pytest.mark.gpu
def test_cuda_events_read_every_few_steps_come_out_in_order():
    """Read every 4th call (a binary search for the newest completed end), then flushed: every step comes out
    once, in order, with the GPU's figures."""
    import torch

    timer, x, timings = StepTimer(cuda=True, read_every=4), torch.randn(1024, 1024, device="cuda"), []
    for step in range(30):
        timer.step_start()
        for _ in range(4):
            x = torch.tanh(x @ x)
        timer.step_end(step)
        got = timer.pop_ready()
        assert step % 4 == 3 or got == []  # nothing read between the 4th calls
        timings += got
    torch.cuda.synchronize()
    timings += timer.pop_ready(flush=True)
    assert [t.step for t in timings] == list(range(30))
    assert all(t.gpu_step_ms > 0 for t in timings) and all(t.gpu_gap_ms >= 0 for t in timings[1:])
