"""Subclass BoostDataModule: return datasets, get pinned, persistent, well-sized DataLoaders.

    python examples/boost_datamodule.py
"""

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import Dataset

from lightning_gpu_boost.datamodules import BoostDataModule


class RandomVectors(Dataset):
    def __init__(self, n: int) -> None:
        self.data = torch.randn(n, 32)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


class VectorData(BoostDataModule):
    def train_dataset(self):
        return RandomVectors(256)

    def val_dataset(self):
        return RandomVectors(64)


if __name__ == "__main__":
    datamodule = VectorData(batch_size=32)
    loader = datamodule.train_dataloader()
    print(f"workers={loader.num_workers} pin_memory={loader.pin_memory} persistent={loader.persistent_workers}")
    Trainer(max_epochs=1, logger=False, enable_checkpointing=False).fit(BoringModel(), datamodule=datamodule)
