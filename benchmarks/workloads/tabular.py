"""Tabular rows read one by one, as a typical ``Dataset`` over a feature matrix is written: ``__getitem__`` returns
one row and its label, the default collate stacks them into batches of 8,192, ``num_workers=0``, an MLP.

Expected: the loader limits it (per-sample Python and collate cost far more than the MLP's step).
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

EXPECTED = {"cpu": "data-bound", "gpu": "data-bound"}
SIZES = {
    "cpu": {"rows": 100_000, "features": 64, "batch": 2048, "steps": 12},
    "gpu": {"rows": 2_000_000, "features": 64, "batch": 8192, "steps": 60},
}


class Rows(Dataset):
    def __init__(self, n: int, features: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, features, generator=g)
        self.y = (self.x[:, 0] + 0.5 * self.x[:, 1] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class MLP(pl.LightningModule):
    def __init__(self, features: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, 2))  # fmt: skip

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def prepare(root: Path, size: str) -> Path:
    return Path(root)  # the rows are made in memory


def build(data: Path, size: str):
    cfg = SIZES[size]
    loader = DataLoader(Rows(cfg["rows"], cfg["features"]), batch_size=cfg["batch"], shuffle=True)
    return MLP(cfg["features"]), loader, None, {"max_steps": cfg["steps"]}
