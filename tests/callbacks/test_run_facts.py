"""The run record (``callbacks/_run_facts.py``): what the loaders and tuners of a fit state, read by their
attributes through the wrappers our callbacks put around the loaders."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest

from lightning_gpu_boost.callbacks import AutoNumWorkers, StreamPrefetch
from lightning_gpu_boost.callbacks._run_facts import loader_facts, run_facts
from lightning_gpu_boost.datamodules import ImageFolderDataModule
from lightning_gpu_boost.models import ImageClassifier


class Facts(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 0:
            self.found = loader_facts(trainer)
            self.facts = run_facts(trainer, found=self.found)


@pytest.mark.parametrize("tuner", [False, True])
def test_the_fits_facts_are_read_from_what_the_parts_state(jpeg_tree, tmp_path, tuner):
    facts = Facts()
    callbacks = [StreamPrefetch(cpu_lookahead=True), facts]
    if tuner:
        callbacks.insert(0, AutoNumWorkers(workers_budget_s=2, cache_path=str(tmp_path / "cache.json")))
    trainer = pl.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)  # fmt: skip
    dm = ImageFolderDataModule(jpeg_tree, image_size=16, batch_size=4, num_workers=1)
    trainer.fit(ImageClassifier("small_cnn", num_classes=3), datamodule=dm)
    f = facts.facts
    assert facts.found["prefetch"] and facts.found["loaders"] and not facts.found["dali"]
    assert f.uint8_images and not f.cuda and f.batch_size == 4 and f.tuner is tuner
    assert f.batches_per_epoch == 6
