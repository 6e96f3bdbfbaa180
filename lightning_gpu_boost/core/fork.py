"""Garbage collected before a loader forks its workers.

A process that has used CUDA may hold unreachable reference cycles whose tensors own CUDA memory or CUDA-pinned
host memory (an earlier fit's batches, a finished ``Trainer``). A worker forked from it inherits those cycles, and
when the garbage collector runs inside the worker it frees them there, where CUDA cannot run: the worker dies with
``CUDA error: initialization error`` and the loader with "DataLoader worker exited unexpectedly". Collecting in the
parent just before the workers fork frees that memory where CUDA works, and leaves the workers nothing to free.
"""

from __future__ import annotations

import gc
import multiprocessing
from typing import Any

import torch


def start_method(loader: Any) -> str:
    """The start method ``loader``'s workers use: its ``multiprocessing_context`` or the process's default."""
    context = getattr(loader, "multiprocessing_context", None)
    if isinstance(context, str):
        return context
    if context is not None and hasattr(context, "get_start_method"):
        return str(context.get_start_method())
    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


def will_fork_workers(loader: Any) -> bool:
    """Whether ``iter(loader)`` starts worker processes by ``fork`` (``False`` where its workers are kept alive
    from an earlier ``iter``: a persistent loader's or a spanning loader's iterator)."""
    if not getattr(loader, "num_workers", 0):
        return False
    kept = getattr(loader, "_iterator", None) is not None
    if kept and (getattr(loader, "persistent_workers", False) or not hasattr(loader, "persistent_workers")):
        return False
    return start_method(loader) == "fork"


def collect_before_fork(loader: Any) -> bool:
    """Run the garbage collector where ``iter(loader)`` is about to fork workers from a process that has
    initialized CUDA; returns whether it ran."""
    if torch.cuda.is_initialized() and will_fork_workers(loader):
        gc.collect()
        return True
    return False
