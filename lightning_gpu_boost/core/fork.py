"""Garbage collected before a loader forks its workers.

A process that has used CUDA may hold unreachable reference cycles whose tensors own CUDA memory or CUDA-pinned
host memory (an earlier fit's batches, a finished ``Trainer``). A worker forked from it inherits those cycles, and
when the garbage collector runs inside the worker it frees them there, where CUDA cannot run: the worker dies with
``CUDA error: initialization error`` and the loader with "DataLoader worker exited unexpectedly". Collecting in the
parent just before the workers fork frees that memory where CUDA works, and leaves the workers nothing to free.

DALI's pipelines hold threads, which fork does not copy: shutting a worker's copy down (its ``__del__``, where the
collector takes a pipeline that was unreachable at the fork) waits for them forever, and the worker and its loader
hang. :func:`keep_dali_out_of_forks` makes every process forked afterwards keep its copies of the native pipelines
and forget them; :func:`shut_dali` stops a pipeline at once, in this process, instead of whenever the collector takes
it. DALI has no public call for either: they use its ``Pipeline._pipes`` (the live pipelines, which its own exit
hook shuts down), each one's ``_pipe`` (the native pipeline) and ``_shutdown``.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
from typing import Any

import torch

log = logging.getLogger(__name__)


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


_DALI_HOOK: list[bool] = []  # one registration per process
_DALI_KEPT: list[Any] = []  # in a forked process: its copies of the native pipelines, never destroyed there


def _forget_dali_in_child() -> None:
    from nvidia.dali.pipeline import Pipeline

    for ref in list(Pipeline._pipes):
        pipe = ref()
        if pipe is not None and pipe._pipe is not None:
            _DALI_KEPT.append(pipe._pipe)  # its destructor would wait for the threads fork did not copy
            pipe._pipe = None
    Pipeline._pipes.clear()


def keep_dali_out_of_forks() -> None:
    """Make every process forked from this one from now on forget the DALI pipelines it copies (call before
    building one; once per process is enough)."""
    if not _DALI_HOOK:
        os.register_at_fork(after_in_child=_forget_dali_in_child)
        _DALI_HOOK.append(True)


def shut_dali(pipe: Any) -> None:
    """Stop a DALI pipeline's threads and free its memory now (``None``: nothing to do). A pipeline that failed may
    fail to stop too: it is then left to the garbage collector, and said at debug level."""
    if pipe is None:
        return
    try:
        pipe._shutdown()
    except Exception as e:
        log.debug("DALI could not shut a pipeline down: %s", e)
