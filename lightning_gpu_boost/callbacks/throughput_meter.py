"""``ThroughputMeter``: samples/s of training steps in the loader's steady state (the rule of ``core/steady.py``)."""

from __future__ import annotations

import time
from itertools import pairwise
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost.core.nvml import NVMLSampler
from lightning_gpu_boost.core.steady import (
    EXTRA_WARMUP,
    SteadyRate,
    batch_size_of,
    min_warmup,
    queue_batches,
    steady_window,
)

__all__ = ['DRAIN_STEPS', 'MAX_EXTENSION', 'ThroughputMeter']

#: steps whose waits show that the loader's queue has drained (their median wait)
DRAIN_STEPS = 8
#: with ``steps``, a window whose halves differ goes on up to this many times ``steps``
MAX_EXTENSION = 3


class ThroughputMeter(Callback):
    """Measures training throughput in steady state, never synchronizing CUDA inside the run.

    It records when every training step ends and how long each step waited for its batch (host clock). The
    window opens after at least ``warmup`` steps *and* the training loader's queue (``num_workers x
    prefetch_factor`` batches, plus prefetch depth) plus a few steps, and then only once the queue has drained:
    when steps start waiting for data (a loader slower than the step), or after twice the queue more (a loader
    that keeps up never drains, and then the queue does not matter). A queue drains at the difference of the two
    rates, so a loader at 60 % of the step's pace needs ~2.5x its queue in steps. With ``steps``, the meter ends
    ``fit`` once that many steps are timed and their halves agree (else it times on, up to three times ``steps``
    or the end of the epoch); where an epoch holds the warm-up and ``steps``, the window lies inside one epoch, after
    the warm-up counted from its start. At the end, :func:`~lightning_gpu_boost.core.steady.steady_window`
    compares the window's halves (moving the start later where they differ by more than 5 %) and reports both.

    ``data_wait_frac`` is the share of the window spent between one ``on_train_batch_end`` and the next
    ``on_train_batch_start`` (fetching, host-side transfer): a host view, which CUDA's run-ahead can blur.
    ``process_cpu_cores`` is this process's CPU time (all its threads, not its DataLoader workers) per second of
    the window.

    Logged metrics:
        None: read :meth:`summary` after ``fit`` (samples/s, step ms, the halves' rates, ``steady``, the queue,
        warm-up and timed steps).

    Args:
        warmup: the fewest training steps excluded from the measurement, ``>= 0`` (the loader's queue plus a few
            steps are excluded in any case).
        steps: stop training once this many steps are timed (``None``: time until ``fit`` ends), ``>= 1``.
        sample_gpu_util: sample the GPU's utilization with NVML during the run (where available).

    Raises:
        ValueError: ``warmup`` not an int ``>= 0``, ``steps`` not an int ``>= 1`` or ``None``, or
            ``sample_gpu_util`` not a bool.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> meter = ThroughputMeter(warmup=5, steps=50)  # ends fit after 50 steps in steady state
        >>> trainer = Trainer(callbacks=[meter], logger=False, enable_progress_bar=False)
    """

    def __init__(self, warmup: int = 5, steps: int | None = None, sample_gpu_util: bool = True) -> None:
        checks.check_int("warmup", warmup, low=0)
        checks.check_int("steps", steps, low=1, allow_none=True)
        self.timed_steps = steps
        checks.check_bool("sample_gpu_util", sample_gpu_util)
        self.warmup = warmup
        self.sample_gpu_util = sample_gpu_util
        self._sampler: NVMLSampler | None = None
        self.reset()

    def reset(self) -> None:
        self.queue = 0
        #: ``_stamps[i]``: when step ``i`` ended (``_stamps[0]``: the start); per-step samples, wait and CPU time
        self._stamps: list[float] = []
        self._samples: list[float] = [0.0]
        self._waits: list[float] = [0.0]
        self._cpu: list[float] = []
        self._window: SteadyRate | None = None
        #: the step after which the window opened (``None``: not yet)
        self.opened_at: int | None = None

    @property
    def steps(self) -> int:
        return self.window().timed

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.reset()
        self.queue = queue_batches(getattr(trainer, "train_dataloader", None)) + 1  # + Lightning's fetcher
        if self.sample_gpu_util and pl_module.device.type == "cuda":
            self._sampler = NVMLSampler(pl_module.device.index or 0, interval=0.05).start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.monotonic()
        if not self._stamps:
            self._stamps.append(now)
            self._cpu.append(time.process_time())
        self._waits.append(now - self._stamps[-1])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._stamps.append(time.monotonic())
        self._cpu.append(time.process_time())
        self._samples.append(float(batch_size_of(batch)))
        done = len(self._stamps) - 1
        first = min_warmup(self.queue, self.warmup)
        if self.opened_at is None and done >= first and self._fits_in_epoch(trainer, batch_idx):
            if self.queue <= 1 or self._drained() or done >= first + 2 * self.queue + EXTRA_WARMUP:
                self.opened_at = done
        if self.opened_at is not None and self.timed_steps:
            timed = done - self.opened_at
            if timed >= self.timed_steps and self._may_stop(trainer, batch_idx, timed):
                trainer.should_stop = True

    def _fits_in_epoch(self, trainer: pl.Trainer, batch_idx: int) -> bool:
        """Whether the window may open at this step of its epoch: where an epoch holds the queue's warm-up and
        ``steps``, the window lies inside one, after the warm-up counted from the epoch's start (a DataLoader's
        workers fill the queue again after an epoch's end, and start again where AutoNumWorkers changed their count:
        beside ResNet-18 on the H200, ``decode="auto"``'s window opened 2 steps into an epoch, after a 1.3 s stall,
        and read 0.97x ``decode="gpu"``'s mid-epoch window on the same placement) and with ``steps`` left in it.
        Shorter epochs, no ``steps``, or a fit that ends before the next epoch could hold the window: any step."""
        per_epoch = trainer.num_training_batches
        if not self.timed_steps or not isinstance(per_epoch, int):
            return True
        warm, rest = min_warmup(self.queue), per_epoch - (batch_idx + 1)
        if per_epoch < warm + self.timed_steps or (batch_idx + 1 >= warm and rest >= self.timed_steps):
            return True
        last_epoch = trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch + 1
        too_few = 0 <= trainer.max_steps < trainer.global_step + rest + warm + self.timed_steps
        return last_epoch or too_few

    def _may_stop(self, trainer: pl.Trainer, batch_idx: int, timed: int) -> bool:
        """``steps`` are timed: stop where the window is steady; else time on (the queue may still have been
        draining when the window opened, and :func:`steady_window` then moves its start later), checking every
        quarter of ``steps``, until :data:`MAX_EXTENSION` times ``steps`` are timed or the epoch ends (an epoch's
        restart is not the steady state)."""
        if timed >= MAX_EXTENSION * self.timed_steps:
            return True
        if batch_idx + 1 >= trainer.num_training_batches:
            return True
        if (timed - self.timed_steps) % max(1, self.timed_steps // 4):
            return False
        self._window = None
        return self.window().steady

    def _drained(self) -> bool:
        """The loader's queue is empty: steps wait for their batches (the median of the last
        :data:`DRAIN_STEPS` waits above 3 % of a step, and above 1 ms). Batches come in order, so a single slow
        worker makes a step wait while later batches sit ready: a few waits do not show an empty queue."""
        if len(self._waits) < DRAIN_STEPS + 1:
            return False
        waits = sorted(self._waits[-DRAIN_STEPS:])
        intervals = sorted(b - a for a, b in pairwise(self._stamps[-(DRAIN_STEPS + 1) :]))
        return waits[len(waits) // 2] > max(0.001, 0.03 * intervals[len(intervals) // 2])

    def on_train_end(self, trainer, pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)  # leave no work behind for whatever runs next
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer, pl_module, stage) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    def window(self) -> SteadyRate:
        """The steady window over the steps recorded so far (samples per second)."""
        if self._window is None or self._window.warmup + self._window.timed != len(self._stamps) - 1:
            warmup = self.warmup if self.opened_at is None else max(self.warmup, self.opened_at)
            self._window = steady_window(self._stamps, self._samples, warmup, self.queue)
        return self._window

    def summary(self) -> dict[str, Any]:
        w = self.window()
        start, end = w.warmup, w.warmup + w.timed
        elapsed = w.seconds or float("nan")
        wait = sum(self._waits[start + 1 : end + 1]) if w.timed else float("nan")
        cpu = self._cpu[end] - self._cpu[start] if w.timed else float("nan")
        util = None
        if self._sampler is not None and w.timed:
            util = self._sampler.mean_util(since=self._stamps[start])
        return {
            "steps": w.timed,
            "opened_at_step": self.opened_at,
            "samples_per_s": w.rate if w.timed else float("nan"),
            "step_ms": 1000 * elapsed / max(1, w.timed),
            "data_wait_frac": wait / elapsed,
            "process_cpu_cores": cpu / elapsed,
            "gpu_util": util,
            **{k: v for k, v in w.as_dict().items() if k not in ("rate", "timed_steps")},
        }
