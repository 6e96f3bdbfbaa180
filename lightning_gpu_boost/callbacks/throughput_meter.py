"""``ThroughputMeter``: samples/s and the host-side data-wait share of training steps, after a warm-up."""

from __future__ import annotations

import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_gpu_boost.core.doctor import batch_size_of
from lightning_gpu_boost.core.nvml import NVMLSampler


class ThroughputMeter(Callback):
    """Measures training throughput over the steps after ``warmup``, synchronizing CUDA only twice
    (at the start and end of the timed window).

    ``data_wait_frac`` is the share of wall time spent between one ``on_train_batch_end`` and the next
    ``on_train_batch_start`` (fetching, host-side transfer): a host view, which CUDA's run-ahead can blur.
    ``process_cpu_cores`` is this process's CPU time (all its threads, not its DataLoader workers) per second of
    the window.

    Args:
        warmup: training steps excluded from the measurement, ``>= 0``.
        sample_gpu_util: sample the GPU's utilization with NVML during the timed window (where available).

    Raises:
        ValueError: ``warmup < 0``.
    """

    def __init__(self, warmup: int = 5, sample_gpu_util: bool = True) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup!r}.")
        self.warmup = warmup
        self.sample_gpu_util = sample_gpu_util
        self._sampler: NVMLSampler | None = None
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.samples = 0
        self.wait_s = 0.0
        self._seen = 0
        self._t0: float | None = None
        self._cpu0 = 0.0
        self.cpu_s = 0.0
        self._t_end: float | None = None
        self._last_end: float | None = None
        self.elapsed_s = 0.0

    @staticmethod
    def _sync(pl_module: pl.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def _start(self, pl_module: pl.LightningModule) -> None:
        self._sync(pl_module)
        if self.sample_gpu_util and pl_module.device.type == "cuda":
            self._sampler = NVMLSampler(pl_module.device.index or 0, interval=0.05).start()
        self._t0 = self._last_end = time.perf_counter()
        self._cpu0 = time.process_time()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self.warmup == 0 and self._t0 is None:
            self._start(pl_module)
        elif self._t0 is not None and self._last_end is not None:
            self.wait_s += now - self._last_end

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._seen += 1
        if self._t0 is not None:
            self.steps += 1
            self.samples += batch_size_of(batch)
            self._last_end = time.perf_counter()
        elif self._seen == self.warmup:
            # the window opens at the end of the last warm-up step, so it includes fetching the next batch
            # (at an epoch boundary: the loader's restart)
            self._start(pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._t0 is not None:
            self._sync(pl_module)
            self.elapsed_s = time.perf_counter() - self._t0
            self.cpu_s = time.process_time() - self._cpu0
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer, pl_module, stage) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    def summary(self) -> dict[str, float]:
        elapsed = self.elapsed_s or float("nan")
        return {
            "steps": self.steps,
            "samples_per_s": self.samples / elapsed,
            "step_ms": 1000 * elapsed / max(1, self.steps),
            "data_wait_frac": self.wait_s / elapsed,
            "process_cpu_cores": self.cpu_s / elapsed,
            "gpu_util": self._sampler.mean_util() if self._sampler is not None else None,
        }
