"""Model FLOPs utilization (MFU): the model's FLOPs of one training step, counted once with torch's
``FlopCounterMode`` (forward, backward and the optimizer's step as dispatched), over the time a step takes and the
GPU's peak FLOP/s (which the caller looks up, e.g. with Lightning's ``get_available_flops``). Framework-free.

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

__all__ = ["StepFlops", "mfu"]


class StepFlops:
    """Counts the FLOPs dispatched between :meth:`start` and :meth:`stop` (one training step, in one thread)."""

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

    def stop(self) -> int | None:
        if self._mode is None:
            return self.flops
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        self.flops = int(mode.get_total_flops())
        return self.flops


def mfu(flops_per_step: float | None, step_s: float | None, peak: float | None) -> float | None:
    """``flops_per_step / step_s / peak`` (a share, 0-1), or ``None`` where a figure is missing."""
    if not flops_per_step or not step_s or not peak or math.isnan(step_s) or step_s <= 0:
        return None
    return flops_per_step / step_s / peak
