"""A DataLoader's rate at a worker count, the loader alone: an endless clone at that count (no epoch restarts), a
probe batch size that keeps each batch's fixed cost small, and a steady window of its batches (the timing rule of
:mod:`~lightning_gpu_boost.core.steady`)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.loaders import shutdown_workers
from lightning_gpu_boost.core.steady import MIN_WINDOW_STEPS, SteadyRate, min_warmup, steady_window

__all__ = ["EndlessBatches", "PROBE_BATCH_S", "REAL_BATCH_BUDGET_SHARE", "clone_loader", "measure_batches_per_s",
           "measure_loader", "measurement_seconds", "probe_batch_size", "sample_seconds"]


class EndlessBatches:
    """A batch sampler that repeats another one's epochs without end: a measurement never pays an epoch's restart
    (forking the workers again, the pipeline's bubble), which would make a short epoch look like a slow loader."""

    def __init__(self, batch_sampler: Any) -> None:
        self.batch_sampler = batch_sampler

    def __iter__(self):
        while True:
            empty = True
            for batch in self.batch_sampler:
                empty = False
                yield batch
            if empty:
                return

    def __len__(self) -> int:
        return 2**62


def clone_loader(
    loader: DataLoader,
    num_workers: int,
    prefetch_factor: int = 2,
    batch_size: int | None = None,
    endless: bool = True,
) -> DataLoader:
    """A DataLoader like ``loader`` with another worker count (endless: no persistent workers, a probe is short-lived),
    optionally with smaller batches of the same samples (``batch_size``; plain batch samplers only). A map-style
    dataset's batches repeat its epochs without end (:class:`EndlessBatches`): the steady state, not restarts.

    ``endless=False``: the loader's own epochs instead (its length, its sampler, its ``persistent_workers`` where
    it keeps workers), as training would run it at ``num_workers``: for a fit timed over whole epochs, whose
    starts are what an endless clone leaves out (``batch_size`` is then not allowed)."""
    if not endless and batch_size is not None:
        raise ValueError(f"batch_size must be None where endless=False, got {batch_size!r}.")
    kwargs: dict[str, Any] = {
        "num_workers": num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context if num_workers else None,
        "prefetch_factor": prefetch_factor if num_workers else None,
    }
    if not endless:
        kwargs["persistent_workers"] = bool(loader.persistent_workers) and num_workers > 0
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=batch_size or loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is None:  # batch_size=None: each of the sampler's items is a batch already
        kwargs.update(sampler=EndlessBatches(loader.sampler) if endless else loader.sampler, batch_size=None)
    elif not endless:
        kwargs["batch_sampler"] = loader.batch_sampler
    elif batch_size and type(loader.batch_sampler) is BatchSampler:
        kwargs["batch_sampler"] = EndlessBatches(BatchSampler(loader.sampler, batch_size, drop_last=False))
    else:
        kwargs["batch_sampler"] = EndlessBatches(loader.batch_sampler)
    return DataLoader(loader.dataset, **kwargs)


#: a probe batch holds at least this much work (seconds in one process), so that a worker's fixed cost per batch
#: (IPC, pickling, collate calls: a millisecond or more) cannot change the ranking
PROBE_BATCH_S = 0.25

#: the probe keeps the loader's own batch size where the search's three costliest usual measurements (the most
#: workers, half and a quarter of them) fit in this share of the budget at that size
REAL_BATCH_BUDGET_SHARE = 1 / 3


def measurement_seconds(workers: int, batch_s: float, prefetch_factor: int, min_window_s: float, cpus: int) -> float:
    """Seconds one steady-state measurement of ``workers`` should take where one batch costs ``batch_s`` in one
    process: startup, the queue and a few batches, the window (at least ``min_window_s``), the shutdown."""
    batches = min_warmup(workers * prefetch_factor if workers else 0) + max(MIN_WINDOW_STEPS, 2 * max(1, workers))
    startup = 0.2 + 0.03 * workers if workers else 0.0
    return startup + max(min_window_s, batches * batch_s / max(1, min(workers, cpus))) + batch_s


def probe_batch_size(
    loader: DataLoader,
    sample_s: float | None,
    budget_s: float = 30.0,
    max_workers: int = 1,
    prefetch_factor: int = 2,
    min_window_s: float = 1.0,
    cpus: int | None = None,
) -> int | None:
    """Samples per probe batch: the loader's own batch size wherever the search fits the budget at that size (a
    smaller batch can rank worker counts differently: a worker's cost per batch is not always linear in its
    samples); fewer only where it would not fit, down to :data:`PROBE_BATCH_S` of work per batch (e.g. one
    12 MP photo), which still ranks counts by time per sample while a worker's fixed cost per batch stays
    negligible. ``None`` where the loader's batching cannot be changed (a custom batch sampler, no
    ``batch_size``)."""
    size = loader.batch_size
    if size is None or type(loader.batch_sampler) is not BatchSampler or isinstance(loader.dataset, IterableDataset):
        return None
    if not sample_s or sample_s <= 0:
        return size
    cpus = cpus or max(1, usable_cpus())
    top = max(1, max_workers)
    counts = sorted({top, max(1, top // 2), max(1, top // 4)})

    def fits(b: int) -> bool:
        spent = sum(measurement_seconds(w, b * sample_s, prefetch_factor, min_window_s, cpus) for w in counts)
        return spent <= budget_s * REAL_BATCH_BUDGET_SHARE

    if fits(size):
        return size
    low = max(1, min(size, math.ceil(PROBE_BATCH_S / sample_s)))
    high = size  # the largest batch that fits, never below ``low``
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def sample_seconds(loader: DataLoader, max_s: float = 1.0) -> float | None:
    """One sample's load time in this process as a DataLoader worker would take it (the fetch path:
    ``__getitems__`` or ``__getitem__``, then ``collate_fn``; torch at one thread, as PyTorch sets each worker:
    a transform made of torch ops, an elastic warp say, runs several times faster on the main process's threads
    than in a worker, and the search would plan windows too short for the workers' batches), from fetches of
    1, 1, 2, 4, ... samples until one takes 50 ms, the batch size is reached or ``max_s`` has passed; ``None``
    for iterable datasets or custom batch samplers."""
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset) or loader.batch_sampler is None:
        return None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _sample_seconds(loader, dataset, max_s)
    finally:
        torch.set_num_threads(threads)


def _sample_seconds(loader: DataLoader, dataset: Any, max_s: float) -> float | None:
    indices: list[int] = []
    for batch in loader.batch_sampler:
        indices.extend(batch)
        if len(indices) >= 2 * (loader.batch_size or 1) + 2:
            break
    if not indices:
        return None
    getitems = getattr(dataset, "__getitems__", None)
    start, k, pos, per_sample = time.perf_counter(), 1, 0, None
    first = True
    while pos + k <= len(indices):
        chunk = indices[pos : pos + k]
        t0 = time.perf_counter()
        samples = getitems(chunk) if callable(getitems) else [dataset[i] for i in chunk]
        loader.collate_fn(samples)
        took = time.perf_counter() - t0
        pos += k
        if first:  # the first fetch may open files or build caches
            first = False
            continue
        per_sample = took / k
        if took >= 0.05 or k >= (loader.batch_size or 1) or time.perf_counter() - start >= max_s:
            break
        k *= 2
    return per_sample


def measure_loader(loader: DataLoader, workers: int, cap_s: float, min_window_s: float) -> SteadyRate:
    """The loader alone in steady state, in batches/s (the rule of :mod:`~lightning_gpu_boost.core.steady`).

    Skips the loader's queue (``workers x prefetch_factor`` batches) plus a few batches, then times at least
    two waves (one batch per worker each), :data:`~lightning_gpu_boost.core.steady.MIN_WINDOW_STEPS` batches
    and ``min_window_s``; where the window's halves still differ by more than 5 %, it goes on (up to three times
    as long) while ``cap_s`` allows. A loader shorter than the measurement is restarted (a loader from
    :func:`clone_loader` never ends: its epochs follow each other in one iterator). Returns a window with ``timed == 0`` where ``cap_s`` ended it before the
    warm-up was over. The workers are shut down and joined before returning.
    """
    queue = workers * (loader.prefetch_factor or 0) if workers else 0
    warm = min_warmup(queue)
    need = max(MIN_WINDOW_STEPS, 2 * max(1, workers))
    start = time.perf_counter()
    stamps = [start]
    it = iter(loader)

    def next_batch() -> None:
        nonlocal it
        try:
            next(it)
        except StopIteration:
            shutdown_workers(it)
            it = iter(loader)
            next(it)  # an empty loader raises StopIteration here

    result: SteadyRate | None = None
    try:
        while True:
            next_batch()
            now = time.perf_counter()
            stamps.append(now)
            timed = len(stamps) - 1 - warm
            if now - start >= cap_s:
                break
            if timed < need or timed % max(1, need // 2) or now - stamps[warm] < min_window_s:
                continue
            result = steady_window(stamps, queue=queue)
            if result.steady or (timed >= 3 * need and now - stamps[warm] >= 3 * min_window_s):
                break
    except StopIteration:  # an empty loader
        pass
    finally:
        shutdown_workers(it)
    if len(stamps) - 1 - warm < 2:
        return SteadyRate(0.0, 0.0, 0.0, queue, warm, 0, 0.0)
    return steady_window(stamps, queue=queue)


def measure_batches_per_s(loader: DataLoader, workers: int, cap_s: float, min_window_s: float) -> float:
    """:func:`measure_loader`'s rate alone (batches/s; 0.0 where no window was timed)."""
    return measure_loader(loader, workers, cap_s, min_window_s).rate
