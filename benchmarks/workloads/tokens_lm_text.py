"""The same language model fed raw text tokenized on the fly in the workers (a regex word tokenizer and a vocabulary
lookup per sample, as projects that skip a pretokenizing pass write it), 2 workers.

Expected: compute-bound on both machines (tokenizing a window costs well under a millisecond per sample, the step
tens of milliseconds); written down before the first run, like every expectation here.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from tokens_lm import GPT
from torch.utils.data import DataLoader, Dataset

EXPECTED = {"cpu": "ok", "gpu": "ok"}
SIZES = {
    "cpu": {"lines": 2_000, "block": 64, "batch": 8, "dim": 128, "layers": 2, "heads": 4, "vocab": 2048,
            "workers": 2, "steps": 30},
    "gpu": {"lines": 40_000, "block": 512, "batch": 32, "dim": 768, "layers": 8, "heads": 12, "vocab": 50304,
            "workers": 2, "steps": 60},
}  # fmt: skip
WORD = re.compile(r"\w+|[^\w\s]")


class TextWindows(Dataset):
    def __init__(self, path: Path, block: int, vocab: int) -> None:
        self.lines = Path(path).read_text().splitlines()
        words = sorted({w for line in self.lines[:2000] for w in WORD.findall(line)})
        self.ids = {w: i % (vocab - 1) + 1 for i, w in enumerate(words)}
        self.block = block

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int):
        tokens: list[int] = []
        j = i
        while len(tokens) < self.block + 1:  # consecutive lines until the window is full
            tokens += [self.ids.get(w, 0) for w in WORD.findall(self.lines[j % len(self.lines)])]
            j += 1
        chunk = torch.tensor(tokens[: self.block + 1])
        return chunk[:-1], chunk[1:]


def prepare(root: Path, size: str) -> Path:
    cfg = SIZES[size]
    path = Path(root) / "text" / f"corpus-{cfg['lines']}.txt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        words = ["".join(rng.choice(letters, rng.integers(2, 9))) for _ in range(5000)]
        with open(path, "w") as f:
            for _ in range(cfg["lines"]):
                picks = rng.integers(0, len(words), rng.integers(40, 120))
                f.write(" ".join(words[k] for k in picks) + ".\n")
    return path


def build(data: Path, size: str):
    cfg = SIZES[size]
    loader = DataLoader(TextWindows(data, cfg["block"], cfg["vocab"]), batch_size=cfg["batch"], shuffle=True,
                        num_workers=cfg["workers"], pin_memory=size == "gpu")  # fmt: skip
    model = GPT(cfg["vocab"], cfg["block"], cfg["dim"], cfg["layers"], cfg["heads"])
    return model, loader, None, {"max_steps": cfg["steps"]}
