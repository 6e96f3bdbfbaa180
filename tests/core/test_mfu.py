"""Model FLOPs utilization (``core/mfu.py``): a step's FLOPs counted once by torch's FlopCounterMode over its forward,
times TRAIN_FACTOR; MFU only where every figure is known."""

from __future__ import annotations

import torch

from lightning_gpu_boost.core.mfu import TRAIN_FACTOR, StepFlops, mfu


def test_a_steps_forward_counted_and_scaled_to_the_training_step():
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(16, 64)
    counter = StepFlops()
    counter.start()
    loss = layer(x).sum()
    flops = counter.stop(scale=TRAIN_FACTOR)
    loss.backward()  # not counted: it runs outside the mode (in autograd's device thread on CUDA)
    assert flops == 3 * 2 * 16 * 64 * 32 and counter.flops == flops


def test_what_is_dispatched_between_start_and_stop_is_counted():
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
