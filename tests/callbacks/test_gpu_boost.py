"""GPUBoost (``callbacks/gpu_boost.py``): each part switched on and off, backends set only on CUDA, autotuning
turned off for variable shapes and the user's settings restored."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_gpu_boost.callbacks import GPUBoost
from tests.helpers import IndexDataset, RecordingModel


def _fit_with(trainer_kwargs, boost, loader):
    trainer = pl.Trainer(callbacks=boost if isinstance(boost, list) else [boost], max_epochs=1, limit_val_batches=0,
                         **trainer_kwargs)  # fmt: skip
    trainer.fit(RecordingModel(), loader)
    return trainer


class _Conv1dModel(pl.LightningModule):
    """A Conv1d over (N, C, T) batches whose T varies, as padded audio features do."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 8, 3)
        self.autotuning: list[bool] = []

    def training_step(self, batch, batch_idx):
        self.autotuning.append(torch.backends.cudnn.benchmark)
        return self.conv(batch).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize(
    "switches,parts",
    [
        ({}, {"auto_workers", "prefetch", "span_epochs", "watchdog"}),
        ({"prefetch": False}, {"auto_workers", "span_epochs", "watchdog"}),
        ({"auto_workers": False, "watchdog": False}, {"prefetch", "span_epochs"}),
        ({"auto_workers": False, "watchdog": False, "prefetch": False, "span_epochs": False}, set()),
        ({"span_epochs": False}, {"auto_workers", "prefetch", "watchdog"}),
    ],
)
def test_gpu_boost_switches_each_part(trainer_kwargs, tmp_path, switches, parts):
    parts = parts | {"bad_samples"}  # BadSampleReport: always there, a no-op for loaders that skip nothing
    boost = GPUBoost(workers_budget_s=5, **switches)
    assert set(boost.parts) == parts
    if "auto_workers" in parts:
        boost.parts["auto_workers"].cache_path = str(tmp_path / "cache.json")
    trainer = _fit_with(trainer_kwargs, boost, DataLoader(IndexDataset(32), batch_size=4))
    assert trainer.global_step == 8
    state = boost.boost_state()
    assert set(state) == parts | {"version"} and state["version"] == 1
    if "auto_workers" in parts:
        assert state["auto_workers"]["chosen"] == {"train": 0}  # in-memory samples
        GPUBoost().load_boost_state(state)
    if "watchdog" in parts:
        assert boost.parts["watchdog"].summaries


def test_gpu_boost_sets_backends_only_on_cuda(trainer_kwargs):
    before = torch.get_float32_matmul_precision()
    _fit_with(trainer_kwargs, GPUBoost(auto_workers=False), DataLoader(IndexDataset(8), batch_size=4))
    assert torch.get_float32_matmul_precision() == before


@pytest.mark.gpu
def test_gpu_boost_turns_autotuning_off_for_variable_shapes_and_restores_the_users_settings():
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("highest")
    boost = GPUBoost(auto_workers=False, watchdog=False)
    batches = [torch.randn(2, 4, 16 + 8 * (i % 6)) for i in range(12)]  # six shapes
    model = _Conv1dModel()
    pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, callbacks=[boost], logger=False,
               enable_checkpointing=False, enable_progress_bar=False).fit(model, DataLoader(batches, batch_size=None))  # fmt: skip
    assert model.autotuning[:4] == [True] * 4 and not any(model.autotuning[4:]), model.autotuning
    assert boost.applied["cudnn_benchmark"] is False
    assert torch.backends.cudnn.benchmark is False and torch.get_float32_matmul_precision() == "highest"

    fixed = _Conv1dModel()
    pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, callbacks=[GPUBoost(auto_workers=False, watchdog=False)],
               logger=False, enable_checkpointing=False, enable_progress_bar=False,
               ).fit(fixed, DataLoader(batches[:1] * 12, batch_size=None))  # fmt: skip
    assert all(fixed.autotuning) and torch.backends.cudnn.benchmark is False  # fixed shapes keep it, until teardown


@pytest.mark.parametrize("beside", ["twice", "auto_workers", "span_epochs"])
def test_a_part_given_twice_runs_once_and_says_which(beside, trainer_kwargs, caplog):
    """GPUBoost twice, or GPUBoost beside one of its parts: found at setup, the first GPUBoost (or the user's own
    part, with the user's settings) runs, and one line says so; a checkpoint saves and resumes as with one."""
    import logging

    from lightning_gpu_boost.callbacks import AutoNumWorkers, SpanEpochs

    first = GPUBoost(watchdog=False, workers_budget_s=1.0)
    second = {"twice": lambda: GPUBoost(watchdog=False, workers_budget_s=1.0),
              "auto_workers": lambda: AutoNumWorkers(workers_budget_s=1.0, use_cache=False, max_workers=1),
              "span_epochs": SpanEpochs}[beside]()  # fmt: skip
    with caplog.at_level(logging.INFO):
        trainer = _fit_with({**trainer_kwargs, "enable_checkpointing": True}, [first, second],
                            DataLoader(IndexDataset(32), batch_size=4, num_workers=1))  # fmt: skip
    said = [r.getMessage() for r in caplog.records if "stays off" in r.getMessage()]
    assert len(said) == 1, said
    if beside == "twice":
        assert second.running == {} and set(first.running) == set(first.parts)
    else:
        assert beside not in first.running and len(first.running) == len(first.parts) - 1
    assert trainer.global_step == 8
