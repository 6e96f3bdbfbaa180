"""BackwardWindow: when the hand-over thread starts a batch's work (its use by the thread runs on CUDA:
``tests/core/gpu_decode/test_on_gpu.py``)."""

from __future__ import annotations

import threading

import pytest

from lightning_gpu_boost.core.handover import BackwardWindow


@pytest.mark.parametrize(("kwargs", "named"), [({"timeout_s": 0}, "timeout_s"), ({"timeout_s": True}, "timeout_s"),
                                               ({"misses": 0}, "misses"), ({"misses": 1.5}, "misses")])  # fmt: skip
def test_bad_arguments_are_named(kwargs, named):
    with pytest.raises(ValueError, match=named):
        BackwardWindow(**kwargs)


def test_an_open_window_lets_the_thread_through_and_a_closed_one_until_it_opens():
    window = BackwardWindow(timeout_s=30.0)
    window.wait()  # open from the start: the first batches are fetched before any step
    window.close()
    threading.Timer(0.05, window.open).start()  # the training thread enters backward
    window.wait()
    figures = window.figures()
    assert figures["waits"] == 2 and figures["timeouts"] == 0 and figures["off"] is None
    assert figures["waited_ms_mean"] > 0


def test_waits_in_vain_with_no_backward_reported_leave_the_window_open_and_finish_opens_it_for_good():
    window = BackwardWindow(timeout_s=0.001, misses=2)
    window.close()
    window.wait()
    window.open()
    window.wait()  # a wait that found it open: the misses in a row count again from 0
    window.close()
    window.wait()
    assert window.off is None and window.timeouts == 2
    window.wait()
    assert window.off is not None and "2 waits in a row" in window.off
    window.close()  # no longer closes
    window.wait()
    assert window.figures()["waits"] == 4 and window.timeouts == 3
    done = BackwardWindow()
    done.close()
    done.finish()
    done.close()
    done.wait()
    assert done.off == "training ended" and done.figures()["timeouts"] == 0


def test_a_window_that_opens_late_each_step_keeps_gating():
    """A forward that waits for the GPU's queue longer than the timeout: each wait times out, but a backward is
    reported between them, so the window stays in use (it costs only the wait)."""
    window = BackwardWindow(timeout_s=0.001, misses=2)
    for _ in range(5):
        window.close()  # the step's backward ended
        window.wait()  # in vain: the next forward still launches
        window.open()  # its backward, too late for this wait
    assert window.timeouts == 5 and window.off is None
