"""``BadSampleReport``: logs how many bad samples each epoch skipped, as metrics.

The loaders of our DataModules with ``bad_samples="skip"`` count what they skip and warn at each pass's end (their
``bad_sample_log``, a :class:`~lightning_gpu_boost.core.bad_samples.BadSampleLog`); this callback finds them among the
Trainer's loaders and logs their counts. ``GPUBoost`` includes it.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_gpu_boost.core.loaders import leaf_loaders

__all__ = ['BadSampleReport']


def _logs(loaders: Any) -> list[Any]:
    return [log for loader in leaf_loaders(loaders) if (log := getattr(loader, "bad_sample_log", None)) is not None]


class BadSampleReport(Callback):
    """Logs the bad samples each epoch skipped (``bad_samples="skip"`` in our DataModules, or any loader with a
    ``bad_sample_log``). The loaders themselves warn once per pass with the first paths; this adds the metric.

    Logged metrics:
        ``bad_samples/train``, ``bad_samples/val``: samples dropped from their batches in the epoch (this rank's).

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_gpu_boost.callbacks import BadSampleReport
        >>> trainer = Trainer(callbacks=[BadSampleReport()], logger=False, enable_checkpointing=False,
        ...                   enable_progress_bar=False)
    """

    def __init__(self) -> None:
        self._snapshots: dict[str, list[tuple[Any, Any]]] = {}

    def _start(self, stage: str, loaders: Any) -> None:
        self._snapshots[stage] = [(log, log.owner.bad_sample_tracker.snapshot()) for log in _logs(loaders)]

    def _end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        snapshots = self._snapshots.pop(stage, None)
        if not snapshots or trainer.sanity_checking:
            return
        count = sum(log.owner.bad_sample_tracker.since(snapshot)[0] for log, snapshot in snapshots)
        pl_module.log(f"bad_samples/{stage}", float(count), on_step=False, on_epoch=True)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start("train", trainer.train_dataloader)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end(trainer, pl_module, "train")

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start("val", trainer.val_dataloaders)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end(trainer, pl_module, "val")
