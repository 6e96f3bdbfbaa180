"""Pick a DataLoader's ``num_workers`` by measuring it: the loader alone, no model, within a time budget."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from lightning_gpu_boost.core.cpus import processes_per_node, usable_cpus

log = logging.getLogger(__name__)


def default_cache_path() -> Path:
    """``$XDG_CACHE_HOME/lightning_gpu_boost/num_workers.json`` (``~/.cache/...`` by default)."""
    return (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "lightning_gpu_boost"
        / "num_workers.json"
    )


@dataclass
class WorkerProbe:
    """What :func:`tune_num_workers` measured and chose."""

    num_workers: int
    #: worker count -> batches per second (loader alone, steady state)
    table: dict[int, float] = field(default_factory=dict)
    elapsed_s: float = 0.0
    max_workers: int = 0
    cached: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "table": {str(k): v for k, v in self.table.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerProbe:
        data = dict(data)
        data["table"] = {int(k): float(v) for k, v in data.get("table", {}).items()}
        return cls(**data)

    def format_table(self) -> str:
        best = max(self.table.values(), default=0.0) or 1.0
        rows = [f"{w:>7} | {r:10.2f} | {100 * r / best:5.1f} %" for w, r in sorted(self.table.items())]
        return "workers | batches/s  | of best\n" + "\n".join(rows)


def max_workers_for_node(procs_per_node: int | None = None, reserve: int = 0) -> int:
    """Upper bound of the search: usable CPUs shared among the node's processes, minus ``reserve`` CPUs per
    process (e.g. for DALI's CPU threads).

    No CPU is reserved for the main process by default: the probe runs in it, so the measurement already pays
    for it, and on the H100 machine (16 CPUs, ResNet-50 from JPEGs) 16 workers trained 9 % faster than 15
    (``benchmarks/results/auto_num_workers-2026-11-22-h100.json``).
    """
    return max(0, usable_cpus() // max(1, procs_per_node or processes_per_node()) - reserve)


def clone_loader(
    loader: DataLoader, num_workers: int, prefetch_factor: int = 2, batch_size: int | None = None
) -> DataLoader:
    """A DataLoader like ``loader`` with another worker count (no persistent workers: a probe is short-lived),
    optionally with smaller batches of the same samples (``batch_size``; plain batch samplers only)."""
    kwargs: dict[str, Any] = {
        "num_workers": num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context if num_workers else None,
        "prefetch_factor": prefetch_factor if num_workers else None,
    }
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=batch_size or loader.batch_size, drop_last=loader.drop_last)
    elif batch_size and type(loader.batch_sampler) is BatchSampler:
        kwargs["batch_sampler"] = BatchSampler(loader.sampler, batch_size, drop_last=False)
    else:
        kwargs["batch_sampler"] = loader.batch_sampler
    return DataLoader(loader.dataset, **kwargs)


def probe_batch_size(loader: DataLoader, limit: int = 32) -> int | None:
    """Smaller batches for probing (each worker then finishes a batch sooner, so short windows measure steady
    state); ``None`` where the loader's batching cannot be changed."""
    size = loader.batch_size
    if size is None or (
        type(loader.batch_sampler) is not BatchSampler and not isinstance(loader.dataset, IterableDataset)
    ):
        return None
    return min(size, limit)


def _shutdown(iterator: Any) -> None:
    """Stop a DataLoader iterator's workers now and wait for them, so the next measurement runs alone.
    (``_shutdown_workers`` is private to PyTorch; ``tests/core/test_workers.py`` checks it still works.)"""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()


def measure_batches_per_s(loader: DataLoader, workers: int, cap_s: float, min_window_s: float) -> float:
    """Steady-state batches/s: skip the first wave (one batch per worker: startup), then time at least two
    whole waves. A loader shorter than the measurement is restarted (its restart cost counts, as it would in
    training). The workers are shut down and joined before returning."""
    wave = max(1, workers)
    start = time.perf_counter()
    count, t0, end = 0, None, None
    it = iter(loader)

    def next_batch() -> None:
        nonlocal it
        try:
            next(it)
        except StopIteration:
            _shutdown(it)
            it = iter(loader)
            next(it)  # an empty loader raises StopIteration here

    try:
        for _ in range(wave):
            next_batch()
            if time.perf_counter() - start >= cap_s:  # even startup stays within the budget
                return 0.0
        t0 = time.perf_counter()
        while True:
            next_batch()
            count += 1
            end = time.perf_counter()
            if (count >= 2 * wave and end - t0 >= min_window_s) or end - start >= cap_s:
                break
    except StopIteration:  # an empty loader
        pass
    finally:
        _shutdown(it)
    return count / (end - t0) if count and t0 is not None and end is not None else 0.0


def _doubling(max_workers: int) -> list[int]:
    counts, w = [0], 1
    while w < max_workers:
        counts.append(w)
        w *= 2
    if max_workers > 0:
        counts.append(max_workers)
    return counts


#: 0 workers must be this many times faster than the best worker count to be chosen (see ``_choose``)
ZERO_WORKERS_MARGIN = 1.5


def _choose(table: dict[int, float], tolerance: float) -> int:
    """The smallest worker count within ``tolerance`` of the best; 0 only if it is clearly the fastest.

    Loading in the main process (0 workers) stalls the training step for its whole duration, while workers
    overlap with it, so similar loader-alone throughput favours workers; 0 wins only where worker overhead makes
    it faster by ``ZERO_WORKERS_MARGIN`` (cheap, in-memory data, where IPC costs more than loading).
    """
    with_workers = {w: r for w, r in table.items() if w > 0}
    if not with_workers or table.get(0, 0.0) > max(with_workers.values()) * ZERO_WORKERS_MARGIN:
        return 0
    best = max(with_workers.values())
    return min(w for w, r in with_workers.items() if r >= best * (1 - tolerance))


def tune_num_workers(
    dataloader: DataLoader,
    budget_s: float = 30.0,
    candidates: Sequence[int] | None = None,
    tolerance: float = 0.05,
    max_workers: int | None = None,
    prefetch_factor: int = 2,
    min_window_s: float = 0.5,
) -> WorkerProbe:
    """Measure ``dataloader`` alone at several worker counts and return the smallest count within
    ``tolerance`` of the best throughput (0 only where it is clearly fastest), with the measured table.

    The search doubles (0, 1, 2, 4, ..., ``max_workers``) and stops once a step gains less than ``tolerance``,
    then measures the midpoints between the best count and its measured neighbours. Each measurement uses
    batches of at most 32 samples (same samples, same transforms: throughput per sample is what matters, and
    small batches reach steady state sooner), skips the first wave of batches (worker startup), times at least
    two whole waves after it, and joins its workers before the next count starts. The whole probe stays within
    ``budget_s`` (the search ends early, with what it measured, when time runs out).

    Args:
        dataloader: the loader to tune (its dataset, sampler, collate and pinning are kept).
        budget_s: time budget of the whole probe in seconds, ``> 0``.
        candidates: explicit worker counts to measure instead of the doubling search (non-empty, each ``>= 0``).
        tolerance: the relative throughput difference that counts as "as good", in ``[0, 1)``.
        max_workers: upper bound of the search (default: :func:`max_workers_for_node`).
        prefetch_factor: batches per worker in flight while probing.
        min_window_s: shortest timed window per count.

    Raises:
        ValueError: a non-positive budget, empty or negative candidates, or a tolerance outside ``[0, 1)``.

    Example::

        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> cheap = DataLoader(TensorDataset(torch.randn(4096, 8)), batch_size=64)
        >>> tune_num_workers(cheap, budget_s=5, max_workers=2).num_workers  # workers only add overhead
        0
    """
    if not budget_s > 0:
        raise ValueError(f"budget_s must be > 0 seconds, got {budget_s!r}.")
    if candidates is not None:
        candidates = list(candidates)
        if not candidates or any(not isinstance(c, int) or c < 0 for c in candidates):
            raise ValueError(f"candidates must be a non-empty list of ints >= 0, got {candidates!r}.")
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance!r}.")
    if max_workers is not None and max_workers < 0:
        raise ValueError(f"max_workers must be >= 0, got {max_workers!r}.")
    limit = max_workers_for_node() if max_workers is None else max_workers
    small = probe_batch_size(dataloader)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a worker; and leaves no busy intra-op thread team behind in this process
    try:
        return _search(
            dataloader, budget_s, candidates, tolerance, limit, prefetch_factor, min_window_s, small
        )
    finally:
        torch.set_num_threads(threads)


def _search(
    dataloader: DataLoader,
    budget_s: float,
    candidates: list[int] | None,
    tolerance: float,
    limit: int,
    prefetch_factor: int,
    min_window_s: float,
    small: int | None,
) -> WorkerProbe:
    start = time.perf_counter()
    table: dict[int, float] = {}
    planned = sorted(set(candidates)) if candidates is not None else _doubling(limit)
    cap = max(min_window_s * 2, budget_s / (len(planned) + 1))

    def measure(w: int) -> bool:
        left = budget_s - (time.perf_counter() - start)
        if left <= min_window_s and table:
            return False
        probe = clone_loader(dataloader, w, prefetch_factor, small)
        rate = measure_batches_per_s(probe, w, min(cap, left), min_window_s)
        table[w] = rate * (small or 1) / (dataloader.batch_size or 1) if small else rate
        log.debug("num_workers=%d: %.2f batches/s", w, table[w])
        return True

    for w in planned:
        best_before = max((r for c, r in table.items() if c > 0), default=0.0)
        if not measure(w):
            break
        if candidates is None and w > 1 and table[w] < best_before * (1 + tolerance):
            break  # doubling no longer pays
    with_workers = {w: r for w, r in table.items() if w > 0}
    if candidates is None and len(with_workers) > 1:  # refine around the best: one midpoint on each side
        best = max(with_workers, key=with_workers.get)
        neighbours = [max((w for w in with_workers if w < best), default=None),
                      min((w for w in with_workers if w > best), default=None)]  # fmt: skip
        for other in neighbours:
            if other is not None and (mid := (best + other) // 2) not in table and mid > 0:
                if not measure(mid):
                    break
    choice = _choose(table, tolerance)
    return WorkerProbe(choice, dict(sorted(table.items())), time.perf_counter() - start, limit)


# ------------------------------------------------------------------------------------------------ the cache


def _describe(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        if len(value) > 64:
            return [len(value), _describe(value[0]), _describe(value[-1])]
        return [_describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in list(value.items())[:64]}
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    return type(value).__qualname__


def loader_fingerprint(loader: DataLoader, procs_per_node: int) -> str:
    """Key of a probe result: dataset class and settings, transform, collate, batch size, CPU set, processes."""
    dataset = loader.dataset
    parts = {
        "dataset": f"{type(dataset).__module__}.{type(dataset).__qualname__}",
        "dataset_vars": _describe({k: v for k, v in vars(dataset).items() if not k.startswith("_")}),
        "len": len(dataset) if hasattr(dataset, "__len__") else None,
        "collate": _describe(loader.collate_fn),
        "batch_size": loader.batch_size,
        "pin_memory": loader.pin_memory,
        "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "procs_per_node": procs_per_node,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def read_cache(path: str | os.PathLike, key: str) -> WorkerProbe | None:
    try:
        entry = json.loads(Path(path).read_text()).get(key)
    except (OSError, ValueError):
        return None
    if entry is None:
        return None
    probe = WorkerProbe.from_dict(entry)
    probe.cached = True
    return probe


def write_cache(path: str | os.PathLike, key: str, probe: WorkerProbe) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[key] = {**probe.as_dict(), "cached": False}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except (OSError, ValueError) as err:
        log.warning("Could not write the num_workers cache %s: %s", path, err)


def iter_loaders(obj: Any) -> Iterable[DataLoader]:
    """DataLoaders inside ``obj`` (a loader, a list/tuple/dict of loaders, a CombinedLoader's iterables)."""
    if isinstance(obj, DataLoader):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from iter_loaders(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from iter_loaders(value)
    elif hasattr(obj, "loader"):  # a StreamPrefetcher
        yield from iter_loaders(obj.loader)


def set_num_workers(
    loader: DataLoader,
    num_workers: int,
    prefetch_factor: int = 2,
    persistent_workers: bool = True,
    worker_niceness: int = 0,
    rank: int = 0,
) -> None:
    """Change a DataLoader's worker count in place, keeping ``prefetch_factor`` and ``persistent_workers``
    consistent with it (``prefetch_factor`` must be set when going from 0 workers to some); with
    ``worker_niceness > 0`` the workers run at lower CPU priority (:class:`LowPriorityWorkerInit`).

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
        loader.worker_init_fn = LowPriorityWorkerInit(loader.worker_init_fn, worker_niceness, rank)
    if getattr(loader, "_iterator", None) is not None:
        loader._iterator = None  # workers of the old count shut down when it is collected


class LowPriorityWorkerInit:
    """A DataLoader ``worker_init_fn`` that lowers the worker's CPU priority, then runs the original one.

    Niced workers still use every idle cycle, but a training process that needs CPU time gets it first. Off by
    default: on the H100 machine (ResNet-50 from JPEGs, 16 workers) nice 10 cost 9 % of throughput. Where
    Lightning would have installed its seeding ``worker_init_fn`` (``seed_everything(workers=True)``), it runs
    here too.
    """

    def __init__(self, fn: Any = None, niceness: int = 10, rank: int = 0) -> None:
        self.fn, self.niceness, self.rank = fn, niceness, rank

    def __call__(self, worker_id: int) -> None:
        try:
            os.nice(self.niceness)
        except OSError:
            pass
        if self.fn is not None:
            self.fn(worker_id)
        elif int(os.environ.get("PL_SEED_WORKERS", 0)):
            from lightning.fabric.utilities.seed import pl_worker_init_function

            pl_worker_init_function(worker_id, rank=self.rank)
