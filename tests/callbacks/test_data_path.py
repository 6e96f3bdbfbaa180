"""The data path (``core/data_path.py`` and its Lightning adapter ``callbacks/_data_path.py``): the stage read from
Lightning for every loader, the stages run in their declared order whichever part was set up first, the strategy's
own hook given back, and nothing of ours set on the user's loaders."""

from __future__ import annotations

import gc

import lightning.pytorch as pl
import pytest
from torch.utils.data import DataLoader

from lightning_gpu_boost.callbacks import AutoNumWorkers, GPUBoost, SpanEpochs, StreamPrefetch
from lightning_gpu_boost.callbacks._data_path import add_stage, data_path, remove_stage
from lightning_gpu_boost.core.data_path import STAGES, DataPath
from tests.helpers import IndexDataset, RecordingModel


def test_stage_is_read_from_lightning_for_every_loader(trainer_kwargs):
    """Fails loudly if Lightning stops setting its running stage before it processes a stage's loaders."""
    seen = []

    class Spy(pl.Callback):
        def setup(self, trainer, pl_module, stage):
            add_stage(trainer, "copy", "spy", lambda dl, s: seen.append(s) or dl)

        def teardown(self, trainer, pl_module, stage):
            remove_stage(trainer, "spy")

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


def test_stages_run_in_the_declared_order_and_the_strategy_gets_its_hook_back(trainer_kwargs):
    trainer = pl.Trainer(**trainer_kwargs)
    strategy = trainer.strategy
    for stage in reversed(STAGES):  # added last to first: run first to last
        if stage != "strategy":
            add_stage(trainer, stage, stage, lambda dl, s, stage=stage: dl + [stage])
    assert strategy.process_dataloader([]) == [s for s in STAGES if s != "strategy"]
    for stage in STAGES:
        remove_stage(trainer, stage)
    assert "process_dataloader" not in vars(strategy) and strategy.process_dataloader([1]) == [1]
    with pytest.raises(ValueError, match=r"stage must be one of .*got 'unpack'"):
        DataPath().add("unpack", "x", lambda dl, s: dl)


def test_a_loaders_record_goes_with_the_loader():
    path = DataPath()
    loader = DataLoader(IndexDataset(4))
    path.facts(loader).normalize = ((0.5,), (0.5,))
    assert path.known(loader).normalize == ((0.5,), (0.5,))
    del loader
    gc.collect()
    assert len(path._facts) == 0


PARTS = {
    "gpu_boost": lambda: [GPUBoost(watchdog=False, workers_budget_s=1.0)],
    "parts": lambda: [AutoNumWorkers(workers_budget_s=1.0, use_cache=False, max_workers=2), SpanEpochs(),
                      StreamPrefetch(cpu_lookahead=True)],
}  # fmt: skip


@pytest.mark.parametrize("parts", list(PARTS))
def test_nothing_of_ours_is_set_on_the_users_loaders(parts, trainer_kwargs):
    def loaders():
        return (DataLoader(IndexDataset(32), batch_size=4, num_workers=1, shuffle=True),
                DataLoader(IndexDataset(8), batch_size=4))  # fmt: skip

    fresh = [set(vars(loader)) for loader in loaders()]
    train, val = loaders()
    trainer = pl.Trainer(max_epochs=2, callbacks=PARTS[parts](), **trainer_kwargs)
    trainer.fit(RecordingModel(), train, val)
    assert [set(vars(train)), set(vars(val))] == fresh
    facts = data_path(trainer).known(train)  # the record lives in the Trainer, not on its loaders
    assert facts is not None and facts.workers_by == "AutoNumWorkers" and facts.spanned_by() is not None
