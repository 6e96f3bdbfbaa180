from __future__ import annotations

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from lightning_gpu_boost.callbacks._hooks import add_dataloader_hook, remove_dataloader_hook
from tests.helpers import IndexDataset, RecordingModel


def test_stage_is_read_from_lightning_for_every_loader(trainer_kwargs):
    """Fails loudly if Lightning stops setting its running stage before it processes a stage's loaders."""
    seen = []

    class Spy(pl.Callback):
        def setup(self, trainer, pl_module, stage):
            add_dataloader_hook(trainer.strategy, "spy", lambda dl, s: seen.append(s) or dl, before=True)

        def teardown(self, trainer, pl_module, stage):
            remove_dataloader_hook(trainer.strategy, "spy")

    trainer = pl.Trainer(callbacks=[Spy()], max_epochs=1, num_sanity_val_steps=0, **trainer_kwargs)
    model = RecordingModel()
    loader = DataLoader(IndexDataset(8), batch_size=4)
    trainer.fit(model, loader, loader)
    trainer.test(model, loader, verbose=False)
    trainer.predict(model, loader)
    assert seen == ["train", "val", "test", "predict"]
    assert "process_dataloader" not in vars(trainer.strategy)
    seen.clear()  # with a sanity check: its loaders are the validation's
    pl.Trainer(callbacks=[Spy()], max_epochs=1, num_sanity_val_steps=1, **trainer_kwargs).fit(model, loader, loader)
    assert seen == ["val", "train"]


def test_hooks_run_in_order_and_teardown_order_does_not_matter(trainer_kwargs):
    trainer = pl.Trainer(**trainer_kwargs)
    strategy = trainer.strategy
    add_dataloader_hook(strategy, "a", lambda dl, s: dl + ["a"], before=True)
    add_dataloader_hook(strategy, "b", lambda dl, s: dl + ["b"], before=False)
    assert strategy.process_dataloader([]) == ["a", "b"]
    remove_dataloader_hook(strategy, "a")
    assert strategy.process_dataloader([]) == ["b"]
    remove_dataloader_hook(strategy, "b")
    assert "process_dataloader" not in vars(strategy) and strategy.process_dataloader([1]) == [1]
