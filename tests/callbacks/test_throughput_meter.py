"""ThroughputMeter: the timed window opens at the end of the warm-up and counts the steps after it."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
from torch.utils.data import DataLoader

from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
from tests.helpers import IndexDataset, RecordingModel


@pytest.mark.parametrize("warmup", [0, 3])
def test_counts_the_steps_after_warmup(trainer_kwargs, warmup):
    meter = ThroughputMeter(warmup=warmup, sample_gpu_util=False)
    trainer = pl.Trainer(max_steps=8, callbacks=[meter], **trainer_kwargs)
    trainer.fit(RecordingModel(), DataLoader(IndexDataset(32), batch_size=4))
    summary = meter.summary()
    assert summary["steps"] == 8 - warmup and meter.samples == 4 * (8 - warmup)
    assert summary["samples_per_s"] > 0 and 0 <= summary["data_wait_frac"] < 1
    assert summary["process_cpu_cores"] >= 0


def test_rejects_a_negative_warmup():
    with pytest.raises(ValueError, match="warmup must be >= 0, got -1"):
        ThroughputMeter(warmup=-1)
