"""A fed model whose step synchronizes and does Python work every step, as many research loops are written: the
data is in memory as tensors and each batch is one indexing operation (a ``BatchSampler`` as the sampler,
``batch_size=None``: the fast-tensor-loader idiom), so the loader costs about a millisecond; the step reads its
loss back with ``.item()`` for a running Python average, builds a per-class confusion table and the top-5 accuracy
over 100 classes in Python (tens of milliseconds per step at batch 1,024, as the issue's "30 ms in Python").

Expected on the GPU: host-bound (the GPU idles while the host waits on ``.item()`` and runs the Python loop; no data
change helps). On a CPU the step is all host work, and the data wait is small: ok.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

EXPECTED = {"cpu": "ok", "gpu": "host-bound"}
#: plain and GPUBoost runs compared (medians, interleaved): the step's Python and its two syncs vary by about 10 %
#: from one run to the next in one process (H100, benchmarks/results/host_bound_parts-2026-11-24-h100.json)
ROUNDS = 5
SIZES = {
    "cpu": {"samples": 4096, "features": 64, "batch": 64, "hidden": 1024, "steps": 40},
    "gpu": {"samples": 65536, "features": 512, "batch": 1024, "hidden": 2048, "steps": 80},
}


class Classifier(pl.LightningModule):
    def __init__(self, features: int, hidden: int, classes: int = 100) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))  # fmt: skip
        self.classes = classes
        self.running: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.running.append(loss.item())  # a sync every step
        predictions = logits.argmax(-1).tolist()  # and another, to build a table in Python
        table = [[0] * self.classes for _ in range(self.classes)]
        for truth, guess in zip(y.tolist(), predictions, strict=True):
            table[truth][guess] += 1
        accuracy = sum(table[k][k] for k in range(self.classes)) / len(predictions)
        scores = logits.softmax(-1).tolist()  # top-5 accuracy, sorted in Python row by row
        top5 = sum(truth in sorted(range(self.classes), key=row.__getitem__)[-5:]
                   for truth, row in zip(y.tolist(), scores, strict=True)) / len(scores)  # fmt: skip
        self.log("train_top5", top5)
        self.log("train_acc", accuracy, prog_bar=True)
        self.log("train_loss_avg", sum(self.running[-50:]) / len(self.running[-50:]))
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def prepare(root: Path, size: str) -> Path:
    return Path(root)  # the data is made in memory


def build(data: Path, size: str):
    cfg = SIZES[size]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg["samples"], cfg["features"], generator=g)
    y = torch.randint(0, 100, (cfg["samples"],), generator=g)
    dataset = TensorDataset(x, y)  # dataset[list of indices] gathers a whole batch
    batches = BatchSampler(RandomSampler(dataset), batch_size=cfg["batch"], drop_last=False)
    loader = DataLoader(dataset, sampler=batches, batch_size=None)
    return Classifier(cfg["features"], cfg["hidden"]), loader, None, {"max_steps": cfg["steps"]}
