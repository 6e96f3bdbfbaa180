"""``BadSampleReport``: counts, logs and names the bad samples a ``bad_samples="skip"`` source dropped, per epoch.

Our DataModules attach it themselves when ``bad_samples="skip"``; the counting is
:class:`~lightning_gpu_boost.core.bad_samples.BadSampleTracker` (shared memory, written by DataLoader workers).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn

from lightning_gpu_boost.core.bad_samples import describe

__all__ = ['BadSampleReport', 'attach']


class BadSampleReport(pl.Callback):
    """Logs how many bad samples each epoch skipped and warns once per epoch with the first few paths.

    Logged metrics:
        ``bad_samples/train``, ``bad_samples/val``: samples dropped from their batches in the epoch (this rank's).

    Args:
        sources: ``stage -> owner`` where ``owner`` has ``bad_sample_tracker``
            (:class:`~lightning_gpu_boost.core.bad_samples.BadSampleTracker`) and ``sample_path(index)``.

    Example::

        >>> from lightning_gpu_boost.callbacks.bad_samples import BadSampleReport
        >>> report = BadSampleReport({})
        >>> report.history
        []
    """

    def __init__(self, sources: dict[str, Any]) -> None:
        self.sources = sources
        self._snapshots: dict[str, Any] = {}
        #: one entry per finished epoch and stage: ``{"stage", "epoch", "skipped", "paths"}``
        self.history: list[dict[str, Any]] = []

    def _start(self, stage: str) -> None:
        owner = self.sources.get(stage)
        if owner is not None:
            self._snapshots[stage] = owner.bad_sample_tracker.snapshot()

    def _end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        owner, snapshot = self.sources.get(stage), self._snapshots.pop(stage, None)
        if owner is None or snapshot is None:
            return
        count, indices = owner.bad_sample_tracker.since(snapshot)
        paths = [owner.sample_path(i) for i in indices[:5]]
        self.history.append({"stage": stage, "epoch": trainer.current_epoch, "skipped": count, "paths": paths})
        if not trainer.sanity_checking:
            pl_module.log(f"bad_samples/{stage}", float(count), on_step=False, on_epoch=True)
        if count:
            rank_zero_warn(
                f"Epoch {trainer.current_epoch}: skipped {count} bad {stage} samples (bad_samples='skip'): "
                f"{describe(paths, len(indices))}. The next samples took their places; "
                "`lightning-gpu-boost pack` leaves such files out and lists them."
            )

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start("train")

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end(trainer, pl_module, "train")

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start("val")

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end(trainer, pl_module, "val")


def attach(trainer: pl.Trainer | None, sources: dict[str, Any]) -> BadSampleReport | None:
    """Add a :class:`BadSampleReport` for ``sources`` to ``trainer`` (once), from a DataModule's ``setup``."""
    if trainer is None or not sources:
        return None
    for callback in trainer.callbacks:
        if isinstance(callback, BadSampleReport):
            callback.sources.update(sources)
            return callback
    report = BadSampleReport(dict(sources))
    trainer.callbacks.append(report)
    return report
