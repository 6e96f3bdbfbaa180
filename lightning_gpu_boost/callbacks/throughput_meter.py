"""``ThroughputMeter``: samples/s of training steps in the loader's steady state (the rule of ``core/steady.py``)."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_gpu_boost.core.nvml import NVMLSampler
from lightning_gpu_boost.core.steady import SteadyRate, batch_size_of, queue_batches, steady_window


class ThroughputMeter(Callback):
    """Measures training throughput in steady state, never synchronizing CUDA inside the run.

    It records when every training step ends (host clock), and at the end times the window that
    :func:`~lightning_gpu_boost.core.steady.steady_window` picks: after at least ``warmup`` steps *and* the
    training loader's queue (``num_workers x prefetch_factor`` batches, plus prefetch depth) plus a few steps,
    moved later where its first and second half still differ by more than 5 %. So a caller's short warm-up cannot
    make the figure time batches the workers had queued before timing started.

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
        sample_gpu_util: sample the GPU's utilization with NVML during the run (where available).

    Raises:
        ValueError: ``warmup`` not an int ``>= 0``, or ``sample_gpu_util`` not a bool.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> meter = ThroughputMeter(warmup=5)
        >>> trainer = Trainer(callbacks=[meter], logger=False, enable_progress_bar=False)
    """

    def __init__(self, warmup: int = 5, sample_gpu_util: bool = True) -> None:
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {warmup!r}.")
        if not isinstance(sample_gpu_util, bool):
            raise ValueError(f"sample_gpu_util must be True or False, got {sample_gpu_util!r}.")
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
            self._window = steady_window(self._stamps, self._samples, self.warmup, self.queue)
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
            "samples_per_s": w.rate if w.timed else float("nan"),
            "step_ms": 1000 * elapsed / max(1, w.timed),
            "data_wait_frac": wait / elapsed,
            "process_cpu_cores": cpu / elapsed,
            "gpu_util": util,
            **{k: v for k, v in w.as_dict().items() if k not in ("rate", "timed_steps")},
        }
