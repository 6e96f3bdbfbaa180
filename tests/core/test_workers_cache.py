"""The worker probe's cache (``core/workers_cache.py``): round trip and the loader's fingerprint."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_gpu_boost.core.workers import WorkerProbe
from lightning_gpu_boost.core.workers_cache import agreed_probe, loader_fingerprint, read_cache, write_cache


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


def test_a_probe_searched_up_to_another_bound_is_not_taken_from_the_cache(tmp_path):
    """doctor searches up to the node's bound; AutoNumWorkers(max_workers=1) must not apply a count above its own
    bound from that search: it searches again within its range (and the cache keeps the newest)."""
    loader = DataLoader(TensorDataset(torch.zeros(64, 2)), batch_size=4)
    cache = tmp_path / "c.json"
    write_cache(cache, loader_fingerprint(loader, 1), WorkerProbe(16, {0: 1.0, 16: 5.0}, 1.2, 16))
    again = agreed_probe(loader, budget_s=2, cache_path=cache, max_workers=1)
    assert not again.cached and again.num_workers <= 1 and again.max_workers == 1
    assert read_cache(cache, loader_fingerprint(loader, 1)).max_workers == 1
    assert agreed_probe(loader, budget_s=2, cache_path=cache, max_workers=1).cached  # the same bound: a hit
