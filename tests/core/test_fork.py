"""core.fork: garbage collected in the parent before a loader forks its workers from a process that used CUDA, and
DALI's pipelines kept out of forked workers."""

import gc

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_gpu_boost.core import fork
from lightning_gpu_boost.core.spanning import SpanningLoader
from tests.helpers import batches_beside_garbage

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


def _pipeline():
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)
    def echo():
        return fn.external_source(name="x", dtype=types.UINT8, ndim=1)

    pipe = echo()
    pipe.build()
    pipe.feed_input("x", np.zeros((2, 4), np.uint8))
    pipe.run()
    return pipe


def test_a_worker_forked_beside_an_unreachable_dali_pipeline_does_not_hang():
    """A DALI pipeline left to the garbage collector (unreachable in a cycle, the collector off until then) is taken
    in a DataLoader worker forked meanwhile, too: its shutdown there waited forever for threads fork does not copy.
    After ``keep_dali_out_of_forks`` the worker forgets the pipelines it copied; ``shut_dali`` stops one at once."""
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    fork.keep_dali_out_of_forks()
    fork.keep_dali_out_of_forks()  # once per process is enough: a second call registers nothing
    assert len(fork._DALI_HOOK) == 1
    assert batches_beside_garbage(_pipeline) == [[0], [1]]
    stopped = _pipeline()
    fork.shut_dali(stopped)
    fork.shut_dali(None)
    assert stopped._pipe is None  # its threads stopped now, not when the collector takes it
