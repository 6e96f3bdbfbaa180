"""Model FLOPs utilization (MFU): the model's FLOPs of one training step over the time a step takes and the GPU's
peak FLOP/s (which the caller looks up, e.g. with Lightning's ``get_available_flops``). Framework-free.

The step's FLOPs are its forward's, counted once with torch's ``FlopCounterMode``, times :data:`TRAIN_FACTOR` (the
backward taken as twice the forward, the convention of PaLM's MFU: model FLOPs, not the hardware's; the optimizer's
few FLOPs left out). The backward is not counted under the mode: on CUDA it runs in autograd's device thread, and
counting it there crashed the training process (a segfault, in about one run of three on the H200 machine, torch 2.11).

Example::

    >>> import torch
    >>> counter = StepFlops()
    >>> counter.start(); _ = torch.ones(4, 8) @ torch.ones(8, 2); counter.stop()
    128
    >>> round(mfu(128, step_s=1e-6, peak=1e9), 3)
    0.128
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["TRAIN_FACTOR", "StepFlops", "mfu"]

#: a training step's model FLOPs per forward FLOP: the forward once, the backward twice (its input and weight grads)
TRAIN_FACTOR = 3


class StepFlops:
    """Counts the FLOPs dispatched in this thread between :meth:`start` and :meth:`stop` (a step's forward: stop it
    before the backward, and scale by :data:`TRAIN_FACTOR`)."""

    def __init__(self) -> None:
        #: FLOPs of the counted step (``None`` until one was counted)
        self.flops: int | None = None
        self._mode: Any = None

    @property
    def counting(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        from torch.utils.flop_counter import FlopCounterMode

        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()

    def stop(self, scale: float = 1) -> int | None:
        """Stop counting; :attr:`flops` is what was counted times ``scale`` (e.g. :data:`TRAIN_FACTOR` for a
        forward)."""
        if self._mode is None:
            return self.flops
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        self.flops = int(mode.get_total_flops() * scale)
        return self.flops


def mfu(flops_per_step: float | None, step_s: float | None, peak: float | None) -> float | None:
    """``flops_per_step / step_s / peak`` (a share, 0-1), or ``None`` where a figure is missing."""
    if not flops_per_step or not step_s or not peak or math.isnan(step_s) or step_s <= 0:
        return None
    return flops_per_step / step_s / peak
