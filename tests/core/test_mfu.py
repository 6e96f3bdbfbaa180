"""Model FLOPs utilization (``core/mfu.py``): a step's FLOPs counted once by torch's FlopCounterMode, forward and
backward; MFU only where every figure is known."""

from __future__ import annotations

import torch

from lightning_gpu_boost.core.mfu import StepFlops, mfu


def test_a_training_steps_flops_count_forward_and_backward():
    layer = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(16, 64)
    counter = StepFlops()
    counter.start()
    assert counter.counting
    layer(x).sum().backward()
    flops = counter.stop()
    forward = 2 * 16 * 64 * 32
    assert flops == 2 * forward  # the backward of a matmul whose input needs no grad: one more matmul
    assert counter.stop() == flops and not counter.counting


def test_mfu_needs_every_figure():
    assert mfu(1e12, 0.01, 1e15) == 0.1
    assert mfu(None, 0.01, 1e15) is None and mfu(1e12, None, 1e15) is None and mfu(1e12, 0.01, None) is None
    assert mfu(1e12, float("nan"), 1e15) is None
