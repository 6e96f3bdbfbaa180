"""A loader worker leaves CPUs to the training process while a split is set, and takes them back after."""

from __future__ import annotations

import os

import pytest
from torch.utils.data import DataLoader, Dataset

from lightning_gpu_boost.core.gpu_decode import plan
from lightning_gpu_boost.core.gpu_decode.plan import TrainingCpus, reserved_for_training

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs CPU affinity (Linux)")

SHARES = [0.5, 0.0, 0.5, 0.3, 1.0, 0.0, 0.7]


class _Shares(Dataset):
    """Sample ``i`` applies the ``i``-th share, then says which CPUs its worker may run on."""

    def __init__(self) -> None:
        self.cpus = TrainingCpus()

    def __len__(self) -> int:
        return len(SHARES)

    def __getitem__(self, i: int) -> list[int]:
        self.cpus.apply(SHARES[i])
        return sorted(os.sched_getaffinity(0))


def test_reserved_for_training_leaves_small_machines_alone():
    assert [reserved_for_training(n) for n in (1, 2, 4, 5, 8, 16, 64)] == [0, 0, 0, 1, 1, 3, 3]


def test_reserved_for_training_grows_with_the_node_s_training_processes():
    """Under DDP every rank's workers keep off the same first CPUs: 3 for each rank, at most a fifth of them."""
    assert [reserved_for_training(32, p) for p in (1, 2, 4, 8)] == [3, 6, 6, 6]
    assert [reserved_for_training(128, p) for p in (1, 2, 8)] == [3, 6, 24]
    assert reserved_for_training(16, 2) == 3


def test_a_worker_leaves_cpus_for_each_training_process(monkeypatch):
    seen = []
    monkeypatch.setattr(plan, "reserved_for_training", lambda n, processes=1: seen.append(processes) or 0)
    monkeypatch.setattr(plan.torch.utils.data, "get_worker_info", lambda: object())  # as in a loader's worker
    TrainingCpus(processes=2).apply(0.5)
    assert seen == [2]


def test_a_worker_keeps_off_the_first_cpus_during_a_split_only(monkeypatch):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    monkeypatch.setattr(plan, "reserved_for_training", lambda n, processes=1: 1)  # the forked worker sees it
    dataset = _Shares()
    dataset.cpus.apply(0.5)  # the training process (num_workers=0, a probe) ran the transform during a split
    loader = DataLoader(dataset, batch_size=None, num_workers=1, multiprocessing_context="fork")
    seen = list(loader)
    assert seen == [cpus[1:], cpus, cpus[1:], cpus[1:], cpus, cpus, cpus[1:]]
    assert sorted(os.sched_getaffinity(0)) == cpus  # the training process's own CPUs never change


def test_the_training_process_keeps_its_cpus(monkeypatch):
    cpus = os.sched_getaffinity(0)
    monkeypatch.setattr(plan, "reserved_for_training", lambda n, processes=1: 1)
    kept = TrainingCpus()
    kept.apply(0.5)
    assert os.sched_getaffinity(0) == cpus
    kept.apply(0.0)
    assert os.sched_getaffinity(0) == cpus
