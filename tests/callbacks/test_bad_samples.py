"""BadSampleReport (``callbacks/bad_samples.py``): logs what the loaders of a fit skipped, per epoch and stage,
through a plain Trainer on CPU; GPUBoost includes it; loaders that skip nothing log nothing."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest

from lightning_gpu_boost.callbacks import BadSampleReport, GPUBoost
from lightning_gpu_boost.datamodules import ImageFolderDataModule
from lightning_gpu_boost.models import ImageClassifier
from tests.conftest import BROKEN_TREE_GOOD


def _fit(dm, callback):
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])  # fmt: skip
    with pytest.warns(UserWarning, match=r"Epoch 1: skipped \d bad train samples"):
        trainer.fit(ImageClassifier("small_cnn", num_classes=3), datamodule=dm)
    return trainer


@pytest.mark.parametrize("callback", [BadSampleReport, lambda: GPUBoost(auto_workers=False, watchdog=False)])
def test_the_epochs_skipped_samples_are_logged_per_stage(broken_tree, callback):
    root, broken = broken_tree
    dm = ImageFolderDataModule(root, image_size=16, batch_size=16, num_workers=0, val_split=0.2, bad_samples="skip")
    trainer = _fit(dm, callback())
    train, val = trainer.callback_metrics["bad_samples/train"], trainer.callback_metrics["bad_samples/val"]
    assert train + val == len(broken) and 0 < train  # the split keeps each sample in one stage
    assert len(dm.train_dataset()) + len(dm.val_dataset()) == BROKEN_TREE_GOOD + len(broken)


def test_nothing_is_logged_for_loaders_that_skip_nothing(jpeg_tree):
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[BadSampleReport()])  # fmt: skip
    trainer.fit(ImageClassifier("small_cnn", num_classes=3),
                datamodule=ImageFolderDataModule(jpeg_tree, image_size=16, batch_size=8, num_workers=0))  # fmt: skip
    assert not any(k.startswith("bad_samples/") for k in trainer.callback_metrics)
