"""Walking what Lightning hands the loops: the DataLoaders inside a loader, a collection of loaders, a
``CombinedLoader``'s iterables, a ``StreamPrefetcher`` or a ``SpanningLoader``, and changing a DataLoader's worker
count in place (the worker tuners, the prefetcher and the watchdog use them)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

log = logging.getLogger(__name__)

__all__ = ['LowPriorityWorkerInit', 'fixed_worker_count', 'iter_loaders', 'leaf_loaders', 'loader_entries', 'set_num_workers', 'shutdown_workers', 'spanned_loaders', 'splits_by_worker']

def _leaves(obj: Any, spanned: bool = False) -> Iterable[tuple[Any, bool]]:
    """``(loader, spanned)`` for each loader inside ``obj``, DataLoader or not (see :func:`loader_entries`)."""
    if isinstance(obj, DataLoader):
        yield obj, spanned
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _leaves(value, spanned)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _leaves(value, spanned)
    elif hasattr(obj, "spans_epochs") and hasattr(obj, "source"):  # a SpanningLoader (spanning, or resumable only)
        yield from _leaves(obj.source, spanned or bool(obj.spans_epochs))
    elif hasattr(obj, "loader"):  # a StreamPrefetcher
        yield from _leaves(obj.loader, spanned)
    elif obj is not None:
        yield obj, spanned


def shutdown_workers(iterator: Any) -> None:
    """Stop a DataLoader iterator's workers now and wait for them (``None`` or another iterator: nothing).
    (``_shutdown_workers`` is private to PyTorch; ``tests/core/test_workers.py`` checks it still works.)"""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()


def loader_entries(obj: Any, spanned: bool = False) -> Iterable[tuple[DataLoader, bool]]:
    """``(DataLoader, spanned)`` for each DataLoader inside ``obj`` (a loader, a list/tuple/dict of loaders, a
    CombinedLoader's iterables, a StreamPrefetcher); ``spanned``: a ``SpanningLoader`` wraps it (its workers never
    restart between epochs, whatever its ``persistent_workers`` says; its settings are what those workers take)."""
    return ((leaf, s) for leaf, s in _leaves(obj, spanned) if isinstance(leaf, DataLoader))


def leaf_loaders(obj: Any) -> Iterable[Any]:
    """Every loader inside ``obj`` (see :func:`loader_entries`), DataLoaders or not (a ``DALILoader``)."""
    return (leaf for leaf, _ in _leaves(obj))


def iter_loaders(obj: Any) -> Iterable[DataLoader]:
    """DataLoaders inside ``obj`` (see :func:`loader_entries`)."""
    return (loader for loader, _ in loader_entries(obj))


def spanned_loaders(obj: Any) -> set[int]:
    """``id()`` of the DataLoaders inside ``obj`` that a ``SpanningLoader`` wraps (see :func:`loader_entries`)."""
    return {id(loader) for loader, spanned in loader_entries(obj) if spanned}


def fixed_worker_count(loader: Any) -> str | None:
    """Why ``loader``'s worker count must stay what it is, or ``None``: a loader that keeps its own resume state
    (litdata's ``StreamingDataLoader``, torchdata's ``StatefulDataLoader``; a dataset with ``state_dict`` such as
    MosaicML streaming's) splits its data across its workers and records how many produced that state, so another
    count would change which samples a resumed epoch sees. Our own resumable loaders record sample positions,
    whatever the count."""
    from lightning_gpu_boost.core.resume import ResumableDataLoader

    if isinstance(loader, ResumableDataLoader):
        return None
    owner = next((o for o in (loader, getattr(loader, "dataset", None)) if callable(getattr(o, "state_dict", None))), None)
    if owner is not None:
        return (f"{type(owner).__name__} keeps its own resume state, which its split of the data across workers is "
                "part of: another count would change which samples a resumed epoch sees")  # fmt: skip
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, IterableDataset) and not splits_by_worker(dataset):
        return (f"{type(dataset).__name__} is an IterableDataset whose code decides what each worker yields (every "
                "worker the whole stream, unless it splits it by get_worker_info()): another count could change "
                "which samples an epoch sees")  # fmt: skip
    return None


def splits_by_worker(dataset: Any) -> bool:
    """Whether an IterableDataset is known to split its data across workers without overlap, so that its worker
    count never changes which samples an epoch sees: a WebDataset pipeline with its ``split_by_worker`` stage (each
    worker reads its own shards)."""
    stages = getattr(dataset, "pipeline", None)
    return isinstance(stages, list) and any(getattr(s, "__name__", None) == "split_by_worker" for s in stages)


#: how ``AutoNumWorkers()`` applies a worker count by default (its ``prefetch_factor`` where a loader goes from 0
#: workers to some, and ``persistent_workers``); ``doctor``'s trial fit at the count it advises applies it the same way
AUTO_PREFETCH_FACTOR, AUTO_PERSISTENT_WORKERS = 4, True


def set_num_workers(
    loader: DataLoader,
    num_workers: int,
    prefetch_factor: int = 2,
    persistent_workers: bool = True,
    worker_niceness: int = 0,
    seed_fn: Any = None,
) -> None:
    """Change a DataLoader's worker count in place, keeping ``prefetch_factor`` and ``persistent_workers``
    consistent with it (``prefetch_factor`` must be set when going from 0 workers to some); with
    ``worker_niceness > 0`` the workers run at lower CPU priority (:class:`LowPriorityWorkerInit`), then run the
    loader's own ``worker_init_fn``, or ``seed_fn`` where it has none (the framework's worker seeding).

    Takes effect at the loader's next ``iter()``; an existing persistent iterator is dropped so that it does.
    ``persistent_workers`` is read-only on an initialized DataLoader; this is the one place that sets it anyway
    (``tests/core/test_workers.py`` fails loudly if PyTorch changes that).
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers!r}.")
    loader.num_workers = num_workers
    if num_workers > 0 and loader.prefetch_factor is None:
        loader.prefetch_factor = prefetch_factor
    object.__setattr__(loader, "persistent_workers", persistent_workers and num_workers > 0)
    if (
        worker_niceness > 0
        and num_workers > 0
        and not isinstance(loader.worker_init_fn, LowPriorityWorkerInit)
    ):
        loader.worker_init_fn = LowPriorityWorkerInit(loader.worker_init_fn or seed_fn, worker_niceness)
    if getattr(loader, "_iterator", None) is not None:
        loader._iterator = None  # workers of the old count shut down when it is collected


class LowPriorityWorkerInit:
    """A DataLoader ``worker_init_fn`` that lowers the worker's CPU priority, then runs the original one.

    Niced workers still use every idle cycle, but a training process that needs CPU time gets it first. Off by
    default: on the H100 machine (ResNet-50 from JPEGs, 16 workers) nice 10 cost 9 % of throughput. ``fn``: the
    ``worker_init_fn`` it wraps (where Lightning seeds workers, its seeding: :func:`~lightning_gpu_boost._job.
    lightning_worker_seed`).
    """

    def __init__(self, fn: Any = None, niceness: int = 10) -> None:
        self.fn, self.niceness = fn, niceness

    def __call__(self, worker_id: int) -> None:
        try:
            os.nice(self.niceness)
        except OSError:
            pass
        if self.fn is not None:
            self.fn(worker_id)
