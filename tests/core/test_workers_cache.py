"""The worker probe's cache (``core/workers_cache.py``): round trip and the loader's fingerprint."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_gpu_boost.core.workers import WorkerProbe
from lightning_gpu_boost.core.workers_cache import loader_fingerprint, read_cache, write_cache


def test_cache_roundtrip_and_fingerprint(tmp_path):
    loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4)
    key = loader_fingerprint(loader, 1)
    assert key == loader_fingerprint(DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4), 1)
    assert key != loader_fingerprint(DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2), 1)
    assert key != loader_fingerprint(loader, 2)
    assert read_cache(tmp_path / "c.json", key) is None
    write_cache(tmp_path / "c.json", key, WorkerProbe(3, {0: 1.0, 3: 5.0}, 1.2, 7))
    hit = read_cache(tmp_path / "c.json", key)
    assert hit.cached and hit.num_workers == 3 and hit.table == {0: 1.0, 3: 5.0}
