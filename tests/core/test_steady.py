"""The timing rule: the window opens after the loader's queue, and a figure says whether it was steady."""

from __future__ import annotations

import pytest

from lightning_gpu_boost.core.steady import (
    EXTRA_WARMUP,
    ShortWindow,
    batch_size_of,
    min_warmup,
    queue_batches,
    steady_window,
    worst_halves_diff,
)


def stamps(step_s: list[float]) -> list[float]:
    out = [0.0]
    for s in step_s:
        out.append(out[-1] + s)
    return out


def test_the_queue_is_never_timed():
    # 16 queued batches come at once (1 ms), then the loader's real pace (100 ms per batch)
    times = stamps([0.001] * 16 + [0.1] * 60)
    naive = (len(times) - 1 - 2) / (times[-1] - times[2])
    window = steady_window(times, warmup=2, queue=16)
    assert window.warmup >= 16 + EXTRA_WARMUP
    assert window.rate == pytest.approx(10.0, rel=0.01) and window.steady
    assert naive > 1.2 * window.rate  # what a 2-step warm-up alone would have reported


def test_a_transient_moves_the_start_later_and_a_drift_is_flagged():
    # a slow drain: 30 steps at twice the pace after the warm-up, then steady
    times = stamps([0.05] * 30 + [0.1] * 90)
    window = steady_window(times, warmup=0, queue=0)
    assert window.steady and window.rate == pytest.approx(10.0, rel=0.03) and window.warmup >= 30
    drifting = steady_window(stamps([0.05 + 0.001 * i for i in range(100)]), queue=0)
    assert not drifting.steady and drifting.halves_diff > 0.05 and "not steady" in drifting.flag()


def test_units_a_short_window_and_the_report():
    times = stamps([0.1] * 40)
    window = steady_window(times, [0.0] + [32.0] * 40, queue=2)
    assert window.rate == pytest.approx(320.0) and window.as_dict()["queue_batches"] == 2
    short = steady_window(stamps([0.1] * 6), queue=8)
    assert isinstance(short, ShortWindow) and not short.steady and short.timed > 0
    assert worst_halves_diff({"a": window.as_dict(), "b": [{"halves_diff": 0.2}]}) == pytest.approx(0.2)


def test_queue_and_batch_size_helpers():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.zeros(8, 2))
    assert queue_batches(DataLoader(data, num_workers=4, prefetch_factor=3)) == 12
    assert queue_batches(DataLoader(data)) == 0
    assert queue_batches({"a": DataLoader(data, num_workers=2), "b": None}) == 4
    assert min_warmup(12, warmup=3) == 12 + EXTRA_WARMUP and min_warmup(0, warmup=30) == 30
    assert batch_size_of({"x": torch.zeros(5, 2)}) == 5 and batch_size_of([torch.zeros(3)]) == 3
