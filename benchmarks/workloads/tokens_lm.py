"""A small decoder-only language model on a pretokenized corpus, as nanoGPT writes it: a ``np.memmap`` of uint16
token ids, random windows of ``block_size + 1`` tokens, a GPT of a few layers, 2 workers.

Expected: compute-bound (slicing a memmap costs microseconds; the transformer's step is the work).
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

EXPECTED = {"cpu": "ok", "gpu": "ok"}
SIZES = {
    "cpu": {"tokens": 200_000, "block": 64, "batch": 8, "dim": 128, "layers": 2, "heads": 4, "vocab": 2048,
            "workers": 2, "steps": 30},
    "gpu": {"tokens": 20_000_000, "block": 512, "batch": 32, "dim": 768, "layers": 8, "heads": 12, "vocab": 50304,
            "workers": 2, "steps": 60},
}  # fmt: skip


class Windows(Dataset):
    def __init__(self, path: Path, block: int) -> None:
        self.path, self.block = path, block
        self.n = (os.path.getsize(path) // 2 - 1) // block

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        data = np.memmap(self.path, dtype=np.uint16, mode="r")
        chunk = torch.from_numpy(data[i * self.block : (i + 1) * self.block + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


class GPT(pl.LightningModule):
    def __init__(self, vocab: int, block: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True, norm_first=True,
                                           activation="gelu", dropout=0.0)  # fmt: skip
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        return self.head(self.ln(self.blocks(h, mask=mask, is_causal=True)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)


def prepare(root: Path, size: str) -> Path:
    cfg = SIZES[size]
    path = Path(root) / "tokens" / f"train-{cfg['tokens']}-{cfg['vocab']}.bin"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        np.random.default_rng(0).integers(0, cfg["vocab"], cfg["tokens"], dtype=np.uint16).tofile(path)
    return path


def build(data: Path, size: str):
    cfg = SIZES[size]
    loader = DataLoader(Windows(data, cfg["block"]), batch_size=cfg["batch"], shuffle=True,
                        num_workers=cfg["workers"], pin_memory=size == "gpu")  # fmt: skip
    model = GPT(cfg["vocab"], cfg["block"], cfg["dim"], cfg["layers"], cfg["heads"])
    return model, loader, None, {"max_steps": cfg["steps"]}
