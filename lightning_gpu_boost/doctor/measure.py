"""The doctor's measurements: the step on a resident batch (time and GPU utilization), one batch's copy to the GPU,
a validation pass's loading, and short fits timed in a steady window or over whole epochs.

Lightning-bound (each step is timed in a real Trainer); imported by :mod:`lightning_gpu_boost.doctor`.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.loader_rate import clone_loader
from lightning_gpu_boost.core.loaders import (
    AUTO_PERSISTENT_WORKERS,
    AUTO_PREFETCH_FACTOR,
    set_num_workers,
    shutdown_workers,
)
from lightning_gpu_boost.core.steady import (
    MIN_WINDOW_STEPS,
    TimedIterable,
    batch_size_of,
    min_warmup,
    steady_window,
    whole_epoch_rates,
)

__all__ = ["MAX_TIMED_EPOCHS", "NO_VALIDATION_WARNING", "SHORT_EPOCH_WAVES", "UTIL_MAX_S", "UTIL_WINDOW_PERIODS",
           "UTIL_WINDOW_S", "measure_copy_ms", "measure_epochs_fit", "measure_fit", "measure_step", "measure_step_ms",
           "measure_validation_s", "queue_bound", "short_epochs", "trial_fit", "tuned_queue_bound"]


#: Lightning's warning for a model with a ``validation_step`` fitted without validation data: the measurements fit
#: the step alone on purpose
NO_VALIDATION_WARNING = r".*`validation_step` but have no `val_dataloader`.*"


#: seconds of NVML samples the step's utilization is read over (after one driver sample period has passed), at least
#: this many of the driver's sample periods, and the most seconds the step runs longer for them
UTIL_WINDOW_S, UTIL_WINDOW_PERIODS, UTIL_MAX_S = 2.0, 6, 10.0


class _ResidentUntil:
    """One batch, at least ``steps`` times, then again while ``more()`` says so (no length: the epoch ends when
    this iterable does, so that the step runs as long as the utilization window needs)."""

    def __init__(self, batch: Any, steps: int, more: Callable[[], bool]) -> None:
        self.batch, self.steps, self.more = batch, steps, more

    def __iter__(self):
        n = 0
        while n < self.steps or self.more():
            n += 1
            yield self.batch


def _move(batch: Any, device: torch.device) -> Any:
    from lightning.fabric.utilities.apply_func import move_data_to_device

    return move_data_to_device(batch, device)


def measure_copy_ms(batch: Any, device: torch.device, repeats: int = 5) -> float:
    """Milliseconds to copy ``batch`` (as the loader yields it, pinned or not) to ``device``."""
    _move(batch, device)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        _move(batch, device)
    torch.cuda.synchronize(device)
    return 1000 * (time.perf_counter() - start) / repeats


def measure_step_ms(model: Any, batch: Any, steps: int = 10, warmup: int = 3, **trainer_kwargs: Any) -> float:
    """Milliseconds per training step of ``model`` (a LightningModule) on ``batch`` already on the device, in a
    real Trainer (``trainer_kwargs``: e.g. ``precision``), timed in steady state by the rule of
    :mod:`~lightning_gpu_boost.core.steady` (the batches are stamped as Lightning asks for them; no callback)."""
    return measure_step(model, batch, steps, warmup, **trainer_kwargs)[0]


def measure_step(
    model: Any, batch: Any, steps: int = 10, warmup: int = 3, **trainer_kwargs: Any
) -> tuple[float, float | None]:
    """:func:`measure_step_ms` and the GPU's mean utilization (%) over the same steady window, sampled through NVML
    on a CUDA device (``None`` where it cannot be: no CUDA, no NVML). A step on a resident batch that leaves the GPU
    idle is host-bound: syncs, Python between kernels, launch overhead."""
    import lightning.pytorch as pl

    from lightning_gpu_boost.core.nvml import NVMLSampler

    kwargs = {"accelerator": "auto", "devices": 1, "logger": False, "enable_checkpointing": False,
              "enable_progress_bar": False, "enable_model_summary": False, "num_sanity_val_steps": 0,
              "limit_val_batches": 0, **trainer_kwargs}  # fmt: skip
    total = min_warmup(0, warmup) + max(steps, MIN_WINDOW_STEPS)
    trainer = pl.Trainer(max_epochs=1, **kwargs)
    device = trainer.strategy.root_device
    sampler = NVMLSampler(device.index or 0, interval=0.02) if device.type == "cuda" else None
    opens = min_warmup(0, warmup)  # the stamp the utilization window opens at (the timing's least warm-up)
    started = time.perf_counter()

    def more() -> bool:  # utilization needs seconds of samples: a window of a few short steps holds one or none
        if sampler is None or not sampler.available or len(batches.stamps) <= opens:
            return False
        now = time.perf_counter()
        period = sampler.sample_period() or 0.0
        needed = max(UTIL_WINDOW_S, UTIL_WINDOW_PERIODS * period) + period
        return now - batches.stamps[opens] < needed and now - started < UTIL_MAX_S

    batches = TimedIterable(_ResidentUntil(_move(batch, device), total + 1, more))
    clock = time.monotonic() - time.perf_counter()  # the stamps' clock to the sampler's
    if sampler is not None:
        sampler.start()
    try:
        with warnings.catch_warnings():  # the step is measured alone: the user's validation is not part of it
            warnings.filterwarnings("ignore", message=NO_VALIDATION_WARNING)
            trainer.fit(model, batches)
    finally:
        if sampler is not None:
            sampler.stop()
    window = steady_window(batches.stamps[: total + 1], warmup=warmup)
    util = None
    if sampler is not None and sampler.available and window.warmup < len(batches.stamps):
        # up to the last step's start: the fit's teardown after it leaves the GPU idle
        util = sampler.mean_util(since=batches.stamps[window.warmup] + clock, settle=True,
                                 until=batches.stamps[-1] + clock)  # fmt: skip
    return (1000 / window.rate if window.rate > 0 else float("nan")), util


def measure_validation_s(loader: Any, batches: int | None = None, cap_s: float = 10.0) -> float:
    """Seconds one epoch's validation spends loading: ``batches`` batches (all by default) from a fresh iterator,
    as each epoch starts one; with persistent workers the first pass starts them and the second is timed. A pass
    cut by ``cap_s`` is extrapolated from the batches it read."""
    try:
        total = len(loader)
    except TypeError:
        total = None
    n = min(batches or total or 1, total or batches or 1)
    persistent = bool(getattr(loader, "persistent_workers", False))
    seconds, read = 0.0, 0
    for _ in range(2 if persistent else 1):
        started, read = time.perf_counter(), 0
        it = iter(loader)  # timed too: starting the workers is part of an epoch's validation (timed after it, a
        # pass on the loaded 2-CPU CI machine read 0.24 s where each worker sleeps 0.3 s in its init)
        for _batch in it:
            read += 1
            if read >= n or time.perf_counter() - started > cap_s:
                break
        seconds = time.perf_counter() - started
        if not persistent:
            shutdown_workers(it)
    return seconds * n / max(1, read)


def trial_fit(model: Any, loader: DataLoader, count: int, steps: int, persistent_workers: bool | None = None,
              **trainer_kwargs: Any) -> dict[str, Any]:  # fmt: skip
    """A short fit of ``model`` with ``loader`` at ``count`` workers, as training would run it: the loader's own
    epochs, at another count than its own as ``AutoNumWorkers()`` applies it (its workers kept between epochs by
    default; ``persistent_workers`` overrides that, e.g. ``False`` for a count set by hand). Timed over whole epochs
    where an epoch is short (:func:`short_epochs`, :func:`measure_epochs_fit`: each epoch's start is in the figure),
    else in a steady window of ``steps`` steps (:func:`measure_fit`, on an endless clone). Returns the fit's figures
    with ``"measured"``: ``"whole epochs"`` or ``"steps"``.

    An endless clone (the loader-alone measurements') has no epoch to start: ``photos_hr`` on the H200 (24 batches
    an epoch, 16 workers, so two waves of them, one half empty) read 85 samples/s in a window where the
    ``AutoNumWorkers()`` run made 65 over whole epochs, and 16 workers started again every epoch 53."""
    epochs = clone_loader(loader, loader.num_workers, loader.prefetch_factor or 2, endless=False)
    if count != loader.num_workers:
        keep = AUTO_PERSISTENT_WORKERS if persistent_workers is None else persistent_workers
        set_num_workers(epochs, count, AUTO_PREFETCH_FACTOR, keep)
    if short_epochs(epochs):
        fit = measure_epochs_fit(model, epochs, steps=steps, **trainer_kwargs)
        shutdown_workers(getattr(epochs, "_iterator", None))  # persistent workers: stopped now, not when collected
        epochs._iterator = None
        return fit
    fit = measure_fit(model, clone_loader(epochs, count, epochs.prefetch_factor or 2), steps=steps, warmup=3,
                      **trainer_kwargs)  # fmt: skip
    return {**fit, "measured": "steps"}


def measure_fit(model: Any, data: Any, steps: int, warmup: int, callbacks: tuple = (), **trainer_kwargs: Any) -> dict[str, Any]:
    """Fit ``model`` on ``data`` (a DataLoader or a LightningDataModule) for ``steps`` steps timed by
    :class:`~lightning_gpu_boost.callbacks.throughput_meter.ThroughputMeter` after the warm-up and the loader's queue
    (the timing rule, ``core/steady.py``); its summary (``samples_per_s``...). ``trainer_kwargs``: ``precision``,
    ``accelerator``..."""
    import lightning.pytorch as pl

    from lightning_gpu_boost.callbacks.throughput_meter import MAX_EXTENSION, ThroughputMeter
    from lightning_gpu_boost.core.steady import EXTRA_WARMUP, min_warmup

    meter = ThroughputMeter(warmup=warmup, steps=steps)  # ends fit once `steps` are timed after the queue drained
    queue = queue_bound(data)
    kwargs = {"accelerator": "auto", "devices": 1, "logger": False, "enable_checkpointing": False,
              "enable_progress_bar": False, "enable_model_summary": False, "num_sanity_val_steps": 0,
              "limit_val_batches": 0, **trainer_kwargs}  # fmt: skip
    limit = min_warmup(queue, warmup) + 2 * queue + EXTRA_WARMUP + MAX_EXTENSION * steps
    try:
        per_epoch = len(data) if isinstance(data, DataLoader) else None
    except TypeError:  # an iterable dataset without a length
        per_epoch = None
    if per_epoch and per_epoch < limit:  # the window may wait for the next epoch's start (the meter keeps it in one)
        limit += per_epoch
    trainer = pl.Trainer(max_steps=limit, callbacks=[meter, *callbacks], **kwargs)
    with warnings.catch_warnings():  # the fits time training alone: the model's validation_step is not used
        warnings.filterwarnings("ignore", message=NO_VALIDATION_WARNING)
        if isinstance(data, pl.LightningDataModule):
            trainer.fit(model, datamodule=data)
        else:  # a DataLoader or any iterable of batches
            trainer.fit(model, train_dataloaders=data)
    return meter.summary()


#: the most epochs :func:`measure_epochs_fit` times (each one starts the loader's workers again)
MAX_TIMED_EPOCHS = 4


#: an epoch of at most this many waves of the loader's workers (a batch from each) is short: :func:`short_epochs`
SHORT_EPOCH_WAVES = 8


def short_epochs(loader: Any) -> bool:
    """``loader`` has workers and an epoch holds at most :data:`SHORT_EPOCH_WAVES` waves of them (a batch from
    each worker): a window of steps cannot stand for what training gets. A DataLoader's workers, persistent or not,
    load an epoch's batches only once it begins (workers that are not persistent also start again), and its last
    wave may leave workers idle: 24 batches from 16 workers come in two waves, one of them half empty (``photos_hr``
    on the H200: a window read 85 samples/s where the run made 65). Longer epochs lose at most one wave in so many
    (at most 1/8 of a window's rate), and are timed in a window: whole epochs would take three of them."""
    if not isinstance(loader, DataLoader) or not loader.num_workers:
        return False
    try:
        return 0 < len(loader) <= SHORT_EPOCH_WAVES * loader.num_workers
    except TypeError:
        return False


def _epoch_ends() -> Any:
    """A Lightning callback that records when each training epoch's last step ended (CUDA synchronized) and its
    samples (built here: this module does not import Lightning at import time)."""
    import lightning.pytorch as pl

    class EpochEnds(pl.Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.samples: list[float] = [0.0]

        def on_train_start(self, trainer, pl_module) -> None:
            self.ends = [time.monotonic()]

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.samples[-1] += batch_size_of(batch)

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            if pl_module.device.type == "cuda":
                torch.cuda.synchronize(pl_module.device)
            self.ends.append(time.monotonic())
            self.samples.append(0.0)

    return EpochEnds()


def measure_epochs_fit(model: Any, loader: DataLoader, steps: int, warmup_epochs: int = 1, callbacks: tuple = (),
                       val_loader: Any = None, val_batches: int | None = None,
                       **trainer_kwargs: Any) -> dict[str, Any]:  # fmt: skip
    """Fit ``model`` on ``loader`` for ``warmup_epochs`` and then whole epochs holding ``steps`` steps (two epochs
    at least, :data:`MAX_TIMED_EPOCHS` at most), and time those epochs from the end of the last warm-up epoch to
    the end of the last one: each timed epoch's start (its workers started again, their first batches) is in the
    figure, as in the run. Returns :func:`~lightning_gpu_boost.core.steady.whole_epoch_rates`' figures
    (``samples_per_s``, ``"measured": "whole epochs"``, ``epochs_timed``, the halves: the first and the last half
    of the timed epochs). ``callbacks`` join the fit; ``val_loader``
    (``val_batches`` of it, all by default) validates after every epoch, as the project does, else none."""
    import lightning.pytorch as pl

    checks.check_int("steps", steps, low=1)
    checks.check_int("warmup_epochs", warmup_epochs, low=1)
    timed = max(2, min(MAX_TIMED_EPOCHS, math.ceil(steps / len(loader))))
    clock = _epoch_ends()
    kwargs = {"accelerator": "auto", "devices": 1, "logger": False, "enable_checkpointing": False,
              "enable_progress_bar": False, "enable_model_summary": False, "num_sanity_val_steps": 0,
              "limit_val_batches": 0 if val_loader is None else (val_batches or 1.0), **trainer_kwargs}  # fmt: skip
    trainer = pl.Trainer(max_epochs=warmup_epochs + timed, callbacks=[clock, *callbacks], **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NO_VALIDATION_WARNING)
        trainer.fit(model, train_dataloaders=loader, val_dataloaders=val_loader)
    return whole_epoch_rates(clock.ends[warmup_epochs:], clock.samples[warmup_epochs:-1])


def queue_bound(data: Any, procs_per_node: int = 1) -> int:
    """The most batches ``data``'s loader can hold queued: exact for a DataLoader, else the most a DataModule of ours
    can set up in one of ``procs_per_node`` processes (its share of the usable CPUs a worker each,
    ``prefetch_factor=4``, plus the prefetch depth)."""
    from lightning_gpu_boost.core.steady import queue_batches

    if isinstance(data, DataLoader):
        return queue_batches(data) + 1
    if hasattr(data, "prefetch_queue_depth"):  # DALI
        return int(getattr(data, "prefetch_queue_depth", 2) or 2) + 2
    if hasattr(data, "train_dataloader") or hasattr(data, "num_workers"):
        return tuned_queue_bound(procs_per_node)
    return 1


def tuned_queue_bound(procs_per_node: int = 1) -> int:
    """The most batches a loader whose workers we choose can hold queued in one of ``procs_per_node`` processes:
    its share of the usable CPUs a worker each, ``AUTO_PREFETCH_FACTOR`` batches each, plus the prefetch depth."""
    return max(1, usable_cpus() // max(1, procs_per_node)) * AUTO_PREFETCH_FACTOR + 2
