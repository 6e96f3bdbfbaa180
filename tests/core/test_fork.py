"""core.fork: garbage collected in the parent before a loader forks its workers from a process that used CUDA."""

import gc

import torch
from torch.utils.data import DataLoader

from lightning_gpu_boost.core import fork
from lightning_gpu_boost.core.spanning import SpanningLoader

DATA = list(range(8))


def test_a_loader_without_workers_forks_none():
    assert not fork.will_fork_workers(DataLoader(DATA, num_workers=0))


def test_the_start_method_comes_from_the_loader_or_the_process():
    assert fork.start_method(DataLoader(DATA, num_workers=2, multiprocessing_context="spawn")) == "spawn"
    assert fork.start_method(DataLoader(DATA, num_workers=2, multiprocessing_context="fork")) == "fork"
    assert fork.start_method(DataLoader(DATA, num_workers=2)) in ("fork", "spawn", "forkserver")
    assert not fork.will_fork_workers(DataLoader(DATA, num_workers=2, multiprocessing_context="forkserver"))


def test_workers_kept_from_an_earlier_iter_fork_nothing_new():
    loader = DataLoader(DATA, num_workers=1, persistent_workers=True, multiprocessing_context="fork")
    assert fork.will_fork_workers(loader)
    assert list(loader) == [torch.tensor([i]) for i in DATA]
    assert not fork.will_fork_workers(loader)  # its workers are kept
    spanning = SpanningLoader(DataLoader(DATA, num_workers=1, multiprocessing_context="fork"))
    assert fork.will_fork_workers(spanning)
    assert len(list(spanning)) == len(DATA)
    assert not fork.will_fork_workers(spanning)  # the one iterator keeps them


def test_collects_only_where_cuda_is_initialized_and_workers_fork(monkeypatch):
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(1) or 0)
    forking = DataLoader(DATA, num_workers=1, multiprocessing_context="fork")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert not fork.collect_before_fork(forking) and not calls
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert fork.collect_before_fork(forking) and calls == [1]
    assert not fork.collect_before_fork(DataLoader(DATA, num_workers=1, multiprocessing_context="spawn"))
    assert calls == [1]
