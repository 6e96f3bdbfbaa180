"""Helpers shared by the pack tests."""

from __future__ import annotations

import pytest

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")

import torch
from torch.utils.data import Dataset

from lightning_gpu_boost.core import lmdb as lf


class Reads(Dataset):
    """Each record's label, read by a :class:`PackReader` (here, not in a test module: a spawned DataLoader worker
    imports the module that defines its dataset, and this one imports neither Lightning nor the DataModules)."""

    def __init__(self, path):
        self.reader = lf.PackReader(path)

    def __len__(self):
        return len(self.reader)

    def __getitem__(self, i):
        return torch.tensor(self.reader.read(i, lambda r: r.label))


def _records(path):
    reader = lf.PackReader(path)
    return [reader.read(i, lambda r: (bytes(r.payload), r.label)) for i in range(len(reader))]
