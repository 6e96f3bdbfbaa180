"""ThroughputMeter: the figure is the loader's steady rate, whatever warm-up the caller passes."""

from __future__ import annotations

import time

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
from lightning_gpu_boost.core.loader_rate import clone_loader, measure_loader


class FixedCost(Dataset):
    """Each sample costs 10 ms (sleeping, so 4 workers keep their pace on a 2-CPU machine; at 5 ms the Python around
    each sample was a large enough share that a busy neighbour moved the loader and the fit apart by up to 19 %)."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.010)
        return torch.randn(8)


class SlowStart(pl.LightningModule):
    """A step far cheaper than the loader, after a first step that stalls like cuDNN autotuning or compilation:
    the workers fill their queue meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        if batch_idx == 0:
            time.sleep(1.0)
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.timing
@pytest.mark.parametrize("warmup", [0, 2])
def test_the_meter_times_the_loader_not_its_queue(trainer_kwargs, warmup):
    loader = DataLoader(FixedCost(), batch_size=4, num_workers=4, persistent_workers=True)
    steady = measure_loader(clone_loader(loader, 4), 4, cap_s=20, min_window_s=1.0).rate * 4  # samples/s
    meter = ThroughputMeter(warmup=warmup, steps=30, sample_gpu_util=False)
    trainer = pl.Trainer(max_steps=10_000, callbacks=[meter], **trainer_kwargs)
    trainer.fit(SlowStart(), loader)
    summary = meter.summary()
    assert summary["queue_batches"] == 4 * 2 + 1 and summary["warmup_steps"] >= 13
    timed = trainer.global_step - meter.opened_at
    assert 30 <= timed <= 90, "fit ends once the window is timed (longer only while its halves differ)"
    # the queue alone would read ~1.4x the loader: above 1.2x the loader's faster reading (before or after the fit)
    # would be the queue's. The load of a busy machine moves between the readings (beside CPU hogs the fit read
    # 0.79x the loader once; in the whole suite on 2 CPUs, 0.70x), so a slower fit only has to be of the same order
    after = measure_loader(clone_loader(loader, 4), 4, cap_s=20, min_window_s=1.0).rate * 4
    rate = summary["samples_per_s"]
    assert 0.5 * min(steady, after) <= rate <= 1.2 * max(steady, after), (summary, steady, after)


class SlowsDown(SlowStart):
    """Steps of 5 ms, then of 40 ms from step 14 on: a window that opens before the change is not steady (8x, not
    3x: beside a busy neighbour on 2 CPUs the 5 ms steps once took ~18 ms and the halves of 5 and 15 ms agreed)."""

    def training_step(self, batch, batch_idx):
        time.sleep(0.005 if batch_idx < 14 else 0.040)
        return self.layer(batch).sum()


@pytest.mark.timing
def test_an_unsteady_window_goes_on_until_its_halves_agree(trainer_kwargs):
    meter = ThroughputMeter(warmup=0, steps=16, sample_gpu_util=False)
    trainer = pl.Trainer(max_steps=10_000, callbacks=[meter], **trainer_kwargs)
    trainer.fit(SlowsDown(), DataLoader(torch.randn(4096, 8), batch_size=4))
    timed = trainer.global_step - meter.opened_at
    summary = meter.summary()
    assert 16 < timed <= 48 and summary["steady"], (timed, summary)
    assert summary["step_ms"] > 12, "the window's start moved past the change"


@pytest.mark.parametrize("warmup", [0, 3])
def test_counts_the_steps_after_warmup(trainer_kwargs, warmup):
    meter = ThroughputMeter(warmup=warmup, sample_gpu_util=False)
    data = DataLoader(torch.randn(30 * 4, 8), batch_size=4)
    pl.Trainer(max_steps=30, callbacks=[meter], **trainer_kwargs).fit(SlowStart(), data)
    summary = meter.summary()
    assert summary["warmup_steps"] >= max(warmup, 5) and summary["steps"] == 30 - summary["warmup_steps"]
    assert summary["samples_per_s"] > 0 and "halves_diff" in summary and "steady" in summary


class Steady(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("batches,warmup,max_steps,opened", [(20, 3, 60, 5), (20, 12, 60, 12), (20, 16, 60, 25),
                                                             (10, 16, 60, 16), (20, 16, 28, 16), (20, 16, -1, 25)])
def test_the_window_lies_inside_one_epoch_where_one_holds_it(trainer_kwargs, batches, warmup, max_steps, opened):
    """Rule 5 of docs/method.md: where an epoch holds the warm-up (the queue, here 1 batch, plus 4) and ``steps``,
    the window opens after the warm-up counted from its epoch's start, with ``steps`` left in the epoch (20 batches:
    a warm-up ending at step 16 leaves 4, so the window opens 5 steps into the next epoch, at 25); a shorter epoch
    (10 batches), or a fit that ends before the next epoch could hold the window (28 steps), opens it after the
    warm-up as before."""
    meter = ThroughputMeter(warmup=warmup, steps=6, sample_gpu_util=False)
    data = DataLoader(torch.randn(batches * 4, 8), batch_size=4)
    trainer = pl.Trainer(max_steps=max_steps, max_epochs=3 if max_steps < 0 else None, callbacks=[meter],
                         **trainer_kwargs)  # fmt: skip
    trainer.fit(Steady(), data)
    assert meter.opened_at == opened
    if batches == 20 and opened > warmup:  # the window, and the fit, end inside the epoch it opened in
        assert trainer.global_step <= (opened // batches + 1) * batches


@pytest.mark.parametrize("kwargs,match", [({"warmup": -1}, "warmup must be an int >= 0, got -1"),
                                          ({"warmup": 2.5}, "warmup must be an int >= 0, got 2.5"),
                                          ({"steps": 0}, "steps must be an int >= 1 or None, got 0"),
                                          ({"sample_gpu_util": "no"}, "sample_gpu_util must be True or False")])
def test_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ThroughputMeter(**kwargs)
