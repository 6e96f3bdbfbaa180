"""Walking and changing loaders (``core/loaders.py``): set_num_workers keeps a loader consistent, low-priority
workers."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_gpu_boost.core import loaders
from lightning_gpu_boost.core.loaders import set_num_workers


def test_set_num_workers_keeps_the_loader_consistent():
    """`persistent_workers` is read-only on a DataLoader; this fails loudly if PyTorch changes how it is set."""
    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2)
    set_num_workers(loader, 2, prefetch_factor=3)
    assert loader.num_workers == 2 and loader.prefetch_factor == 3 and loader.persistent_workers
    assert sorted(int(x) for (b,) in loader for x in b) == list(range(8))
    set_num_workers(loader, 0)
    assert loader.num_workers == 0 and not loader.persistent_workers and loader._iterator is None
    assert len(list(loader)) == 4


def test_low_priority_workers(tmp_path):
    import os

    class Nice(TensorDataset):
        def __getitem__(self, i):
            return torch.tensor(float(os.nice(0)))

    loader = DataLoader(Nice(torch.zeros(4)), batch_size=2)
    set_num_workers(loader, 1, worker_niceness=5)
    assert isinstance(loader.worker_init_fn, loaders.LowPriorityWorkerInit)
    assert {float(x) for b in loader for x in b} == {os.nice(0) + 5.0}
