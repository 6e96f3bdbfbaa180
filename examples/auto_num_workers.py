"""AutoNumWorkers: start from num_workers=0 and let the callback measure the right count.

    python examples/auto_num_workers.py
"""

import time

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, Dataset

from lightning_gpu_boost.callbacks import AutoNumWorkers


class SlowDataset(Dataset):
    """Each sample costs ~2 ms of CPU, like decoding a small image."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
        return torch.randn(32)


if __name__ == "__main__":
    auto = AutoNumWorkers(workers_budget_s=10)
    trainer = Trainer(callbacks=[auto], max_epochs=1, logger=False, enable_checkpointing=False)
    trainer.fit(BoringModel(), DataLoader(SlowDataset(), batch_size=16))  # note: no num_workers
    print(f"chosen num_workers: {auto.chosen['train']}")
    print(auto.probes["train"].format_table())
