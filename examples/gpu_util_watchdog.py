"""GPUUtilWatchdog on a starving run: a dataset that sleeps per sample and num_workers=0.

    python examples/gpu_util_watchdog.py          # prints the warning with its diagnosis and the summary
"""

import logging
import time

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, Dataset

from lightning_gpu_boost.callbacks import GPUUtilWatchdog


class SlowDataset(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)  # a slow disk or an expensive transform
        return torch.randn(32)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    watchdog = GPUUtilWatchdog(window=10, warmup_steps=5)
    trainer = Trainer(callbacks=[watchdog], max_epochs=1, logger=False, enable_checkpointing=False)
    trainer.fit(BoringModel(), DataLoader(SlowDataset(), batch_size=8))
    print("verdict:", watchdog.verdict)
