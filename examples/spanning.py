"""SpanningLoader: short epochs whose workers never stop, so the next epoch's batches are ready when it starts.

    python examples/spanning.py

An epoch of 8 batches with validation after each: a plain DataLoader's workers start each epoch's batches only when
the epoch begins (and non-persistent ones start again); through SpanningLoader they go on with the next epoch's
batches while this one ends and validates.
"""

import time

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, Dataset

from lightning_gpu_boost.core.spanning import SpanningLoader


class SlowDataset(Dataset):
    """Each sample costs ~2 ms, like decoding a small image."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.randn(32)


def fit(train, val) -> float:
    trainer = Trainer(max_epochs=4, limit_val_batches=2, num_sanity_val_steps=0, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    start = time.perf_counter()
    trainer.fit(BoringModel(), train, val)
    return time.perf_counter() - start


if __name__ == "__main__":
    plain = fit(DataLoader(SlowDataset(), batch_size=8, num_workers=2),
                DataLoader(SlowDataset(), batch_size=8, num_workers=2))  # fmt: skip
    train = SpanningLoader(DataLoader(SlowDataset(), batch_size=8, num_workers=2))
    val = SpanningLoader(DataLoader(SlowDataset(), batch_size=8, num_workers=2), batches_per_epoch=2)
    spanning = fit(train, val)
    train.close()
    val.close()
    print(f"4 short epochs: plain loaders {plain:.2f} s, SpanningLoader {spanning:.2f} s")
