"""Pick a DataLoader's ``num_workers`` by measuring it: the loader alone, no model, within a time budget (each count's
rate measured by :mod:`~lightning_gpu_boost.core.loader_rate`)."""

from __future__ import annotations

import gc
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost.core.cpus import processes_per_node, usable_cpus
from lightning_gpu_boost.core.loader_rate import (
    clone_loader,
    measure_loader,
    measurement_seconds,
    probe_batch_size,
    sample_seconds,
)

__all__ = ['decide_workers_again', 'CONTENDER_SPREAD', 'QUICK_SHARE', 'QUICK_WINDOW_SPREAD', 'SHUTDOWN_S', 'WorkerProbe', 'WorkersDied', 'ZERO_WORKERS_MARGIN', 'max_workers_for_node', 'tune_num_workers']

log = logging.getLogger(__name__)



@dataclass
class WorkerProbe:
    """What :func:`tune_num_workers` measured and chose."""

    num_workers: int
    #: worker count -> batches per second at the loader's own batch size (loader alone, steady state)
    table: dict[int, float] = field(default_factory=dict)
    elapsed_s: float = 0.0
    max_workers: int = 0
    cached: bool = False
    #: the loader's ``num_workers`` before the probe
    user_workers: int = 0
    #: ``False`` where the counts could not be ranked within the budget: ``num_workers`` is then the user's
    conclusive: bool = True
    #: why the choice is what it is, in a sentence (always set where the user's value was kept)
    reason: str = ""
    #: samples per probe batch (the loader's batch size, or fewer where samples are slow: time per sample)
    probe_batch_size: int | None = None
    #: one sample's load time in the main process (fetch + collate), milliseconds
    sample_ms: float | None = None
    #: worker count -> the steady-state window of its measurement (``SteadyRate.as_dict``)
    windows: dict[int, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["table"] = {str(k): v for k, v in self.table.items()}
        data["windows"] = {str(k): v for k, v in self.windows.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerProbe:
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["table"] = {int(k): float(v) for k, v in data.get("table", {}).items()}
        data["windows"] = {int(k): dict(v) for k, v in data.get("windows", {}).items()}
        return cls(**data)

    def as_good(self, fewer: int, than: int, tolerance: float) -> tuple[bool, str]:
        """Whether this probe measured ``fewer`` workers within ``tolerance`` of ``than`` workers, and the figures
        that say so (not measured: ``False``, the choice stays)."""
        if fewer not in self.table or than not in self.table:
            return False, f"the probe did not measure {fewer} workers against {than}"
        a, b = self.table[fewer], self.table[than]
        return a >= b * (1 - tolerance), f"the loader alone measured {a:.1f} batches/s at {fewer} workers, {b:.1f} at {than}"

    def format_table(self) -> str:
        best = max(self.table.values(), default=0.0) or 1.0
        rows = []
        for w, r in sorted(self.table.items()):
            window = self.windows.get(w, {})
            mark = "" if window.get("steady", True) else "  (not steady)"
            rows.append(f"{w:>7} | {r:10.2f} | {100 * r / best:5.1f} %{mark}")
        head = "workers | batches/s  | of best"
        note = f"\n{self.reason}" if self.reason else ""
        return head + "\n" + "\n".join(rows) + note


def max_workers_for_node(procs_per_node: int | None = None, reserve: int = 0) -> int:
    """Upper bound of the search: usable CPUs shared among the node's processes, minus ``reserve`` CPUs per
    process (e.g. for DALI's CPU threads).

    No CPU is reserved for the main process by default: the probe runs in it, so the measurement already pays
    for it, and on the H100 machine (16 CPUs, ResNet-50 from JPEGs) 16 workers trained 9 % faster than 15
    (``benchmarks/results/auto_num_workers-2026-11-22-h100.json``).
    """
    return max(0, usable_cpus() // max(1, procs_per_node or processes_per_node()) - reserve)


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
    with_workers = {w: r for w, r in table.items() if w > 0 and r > 0}
    if not with_workers or table.get(0, 0.0) > max(with_workers.values()) * ZERO_WORKERS_MARGIN:
        return 0
    best = max(with_workers.values())
    return min(w for w, r in with_workers.items() if r >= best * (1 - tolerance))


def tune_num_workers(
    dataloader: DataLoader,
    budget_s: float = 30.0,
    candidates: Sequence[int] | None = None,
    tolerance: float = 0.03,
    max_workers: int | None = None,
    prefetch_factor: int | None = None,
    min_window_s: float = 1.0,
) -> WorkerProbe:
    """Measure ``dataloader`` alone at several worker counts and return the smallest count within
    ``tolerance`` of the best throughput (0 only where it is clearly fastest), with the measured table.

    First one sample's load time is measured in this process. Batches then keep the loader's batch size, unless
    a sample is slow: a probe batch then holds at least :data:`~lightning_gpu_boost.core.loader_rate.PROBE_BATCH_S` of work (e.g. one 12 MP photo),
    which ranks counts by time per sample while a worker's fixed cost per batch stays negligible. The search
    starts at ``max_workers`` and the user's own count, then halves (``max_workers``, ..., 2, 1, 0), stopping
    once a count is clearly slower than the best, and refines between the best and the next count measured below
    it. Each count is timed in steady state (:func:`measure_loader`: the queue skipped, halves compared). A count
    whose measurement cannot fit in what is left of ``budget_s`` is not started: fewer candidates, never shorter
    windows.

    The user's ``num_workers`` is kept (``conclusive=False``, with the reason) where fewer than two counts could
    be timed, and the choice is never below the user's count unless a smaller count measured faster.

    Args:
        dataloader: the loader to tune (its dataset, sampler, collate and pinning are kept).
        budget_s: time budget of the whole probe in seconds, ``> 0``.
        candidates: explicit worker counts to measure instead of the search (non-empty, each ``>= 0``).
        tolerance: the relative throughput difference that counts as "as good", in ``[0, 1)``.
        max_workers: upper bound of the search (default: :func:`max_workers_for_node`).
        prefetch_factor: batches per worker in flight while probing (default: the loader's, else 2).
        min_window_s: shortest timed window per count, ``> 0``.

    Raises:
        ValueError: a non-positive budget or window, empty or negative candidates, or a tolerance outside
            ``[0, 1)``.

    Example::

        >>> import torch
        >>> from torch.utils.data import DataLoader, TensorDataset
        >>> cheap = DataLoader(TensorDataset(torch.randn(4096, 8)), batch_size=64)
        >>> tune_num_workers(cheap, budget_s=10, max_workers=2).num_workers  # workers only add overhead
        0
    """
    checks.check_number("budget_s", budget_s, low=0.0, low_open=True)
    checks.check_number("tolerance", tolerance, low=0.0, high=1.0, high_open=True)
    checks.check_number("min_window_s", min_window_s, low=0.0, low_open=True)
    if candidates is not None:
        candidates = list(candidates)
        if not candidates or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in candidates):
            raise ValueError(f"candidates must be a non-empty list of ints >= 0, got {candidates!r}.")
    checks.check_int("max_workers", max_workers, low=0, allow_none=True)
    checks.check_int("prefetch_factor", prefetch_factor, low=1, allow_none=True)
    limit = max_workers_for_node() if max_workers is None else max_workers
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a worker; and leaves no busy intra-op thread team behind in this process
    # unreachable cycles that hold CUDA-pinned host memory (an earlier fit's batches) would be freed by the
    # garbage collector inside a forked worker, where CUDA cannot run: free them here, before forking (core.fork)
    gc.collect()
    start = time.perf_counter()
    try:
        return _search(
            dataloader, budget_s, candidates, tolerance, limit,
            prefetch_factor or dataloader.prefetch_factor or 2, min_window_s,
        )  # fmt: skip
    except WorkersDied as died:  # keep the user's setting: a probe that broke measured nothing it can rank
        user = dataloader.num_workers
        return WorkerProbe(user, {}, time.perf_counter() - start, limit, user_workers=user, conclusive=False,
                           reason=f"the probe's workers died at num_workers={died.workers} ({died.cause}); "
                                  f"num_workers={user} is kept")  # fmt: skip
    finally:
        torch.set_num_threads(threads)


class WorkersDied(RuntimeError):
    """A probe loader's workers exited unexpectedly (e.g. a worker touched CUDA after the fork)."""

    def __init__(self, workers: int, cause: BaseException) -> None:
        super().__init__(f"workers died at num_workers={workers}: {cause}")
        self.workers, self.cause = workers, cause


def _search(
    dataloader: DataLoader,
    budget_s: float,
    candidates: list[int] | None,
    tolerance: float,
    limit: int,
    prefetch_factor: int,
    min_window_s: float,
) -> WorkerProbe:
    start = time.perf_counter()
    user = dataloader.num_workers
    sample_s = sample_seconds(dataloader, max_s=min(1.0, budget_s / 10))
    cpus = max(1, usable_cpus())
    small = probe_batch_size(dataloader, sample_s, budget_s, limit, prefetch_factor, min_window_s, cpus)
    batch = dataloader.batch_size or 1
    table: dict[int, float] = {}
    rates: dict[int, list[float]] = {}  # every window's rate per count (the table holds their median)
    windows: dict[int, dict[str, Any]] = {}

    def cost(w: int) -> float:
        """Seconds a measurement of ``w`` workers should take: startup, the queue, the window, the shutdown."""
        if sample_s is None:
            return min_window_s
        return measurement_seconds(w, (small or batch) * sample_s, prefetch_factor, min_window_s, cpus)

    def measure(w: int, again: bool = False) -> bool:
        left = budget_s - (time.perf_counter() - start)
        if (w in table and not again) or cost(w) > left:
            return False
        probe = clone_loader(dataloader, w, prefetch_factor, small)
        try:
            window = measure_loader(probe, w, left - (small or batch) * (sample_s or 0.0) - SHUTDOWN_S, min_window_s)
        except RuntimeError as error:
            if w > 0 and "exited unexpectedly" in str(error):
                raise WorkersDied(w, error) from error
            raise
        rate = window.rate * (small or batch) / batch  # batches/s at the loader's own batch size
        if again and rates.get(w) and rate > 0:  # another window: the median of them all
            rates[w].append(rate)
            windows[w] = {**window.as_dict(), "windows": len(rates[w]), "window_rates": list(rates[w])}
            table[w] = statistics.median(rates[w])
        else:
            rates[w] = [rate] if rate > 0 else []
            windows[w] = window.as_dict()
            table[w] = rate
        log.debug("num_workers=%d: %.2f batches/s%s", w, table[w], window.flag())
        return True

    def remeasure(w: int) -> bool:
        return measure(w, again=True)

    def quick(w: int) -> bool:
        """A measurement of ``w`` is short next to the budget (windows of quick loaders move by +-25 % on 16
        CPUs: several of them, interleaved, rank such counts; slow loaders' long windows are steady)."""
        return cost(w) <= budget_s * QUICK_SHARE

    if candidates is not None:
        for w in sorted(set(candidates), reverse=True):
            measure(w)
    else:
        order = sorted(set(_doubling(limit)), reverse=True)
        first = [order[0]] + ([user] if user != order[0] else [])
        for w in first:  # the most workers, and the user's own count
            measure(w)
        for w in (w for w in order if w not in first):
            if not measure(w):
                if w not in table:
                    break  # smaller counts take longer: what is left does not fit in the budget
                continue
            best = max((r for c, r in table.items() if c > 0), default=0.0)
            if w > 0 and table[w] < best * (1 - tolerance):
                break  # halving no longer keeps up with the best
        _refine(table, tolerance, measure)
        _confirm(table, tolerance, remeasure, quick)
    return _decide(table, windows, tolerance, user, limit, small, sample_s, time.perf_counter() - start)


def _refine(table: dict[int, float], tolerance: float, measure: Any, rounds: int = 2) -> None:
    """Bisect between the best count and the largest measured count below it that is out of tolerance."""
    for _ in range(rounds):
        with_workers = {w: r for w, r in table.items() if w > 0 and r > 0}
        if len(with_workers) < 2:
            return
        best_rate = max(with_workers.values())
        good = min(w for w, r in with_workers.items() if r >= best_rate * (1 - tolerance))
        below = [w for w, r in with_workers.items() if w < good and r < best_rate * (1 - tolerance)]
        if not below or good - max(below) < 2:
            return
        if not measure((good + max(below)) // 2):
            return


#: seconds kept back from a window capped by what is left of the budget, for stopping and joining its workers (a
#: worker ends after the sample it is loading: the window's cap already leaves one batch's load time for that); on
#: a loaded 2-CPU machine a probe of 0.25 s samples with a 12 s budget took 12.04 s without it
SHUTDOWN_S = 0.1

#: where one measurement costs at most this share of the budget, the counts the choice rests on get more windows
QUICK_SHARE = 1 / 15

#: counts within this share of the fastest are contenders for the extra windows of quick loaders
CONTENDER_SPREAD = 0.15

#: how far one window of a quick loader moves from the next (+-25 % on 16 CPUs): 0 workers measured faster than
#: every worker count by ``ZERO_WORKERS_MARGIN * (1 + QUICK_WINDOW_SPREAD) / (1 - QUICK_WINDOW_SPREAD)`` (2.5x) stays
#: the choice whichever way the windows move, so no count gets the extra windows (in-memory tensors: 0 workers
#: read 7-35x faster than 1 or 2 on the 2-CPU CI machine, and six more windows took 5-6 s of each such probe)
QUICK_WINDOW_SPREAD = 0.25


def _confirm(table: dict[int, float], tolerance: float, remeasure: Any, quick: Any = None, passes: int = 2) -> None:
    """Time the counts the choice rests on again and keep the median of their windows.

    Where more workers measured clearly slower than the choice (a window that shared the CPUs with something
    else looks like that too), that count and the choice get one more window each. Where every measurement is
    quick (``quick(w)``: loaders whose batches are cheap, often bound by the main process, whose windows move by
    +-25 % from one to the next on 16 CPUs), the contenders (the choice, the fastest count and the counts within
    :data:`CONTENDER_SPREAD` of it, at most four) get ``passes`` more windows, interleaved so that a slow spell hits
    every count alike, as a sweep's passes do. Otherwise, where the choice is a smaller count within ``tolerance``
    of a faster one, the fastest count and the choice get one more window each. A window that does not fit in
    what is left of the budget is not started. None is timed again where 0 workers won by far more than windows
    move (:func:`_decisive_zero`).
    """
    timed = {w: r for w, r in table.items() if r > 0}
    if len(timed) < 2:
        return
    choice = _choose(timed, tolerance)
    if choice == 0 and _decisive_zero(timed):
        return
    slower = [w for w in timed if w > choice and timed[w] < timed[choice] * (1 - tolerance)]
    fastest = max((w for w in timed if w > 0), key=lambda w: timed[w])
    near = sorted((w for w in timed if w > 0 and timed[w] >= timed[fastest] * (1 - CONTENDER_SPREAD)),
                  key=lambda w: -timed[w])[:4]  # fmt: skip
    contenders = sorted({choice, fastest, *near, *([max(slower)] if slower else [])}, reverse=True)
    if quick is not None and all(quick(w) for w in contenders):
        for _ in range(passes):
            for w in contenders:
                if not remeasure(w):
                    return
        return
    if slower and remeasure(max(slower)):  # one confirmation: the largest count that contradicts the choice
        remeasure(choice)
        return
    if fastest != choice and choice > 0 and remeasure(fastest):
        remeasure(choice)


def _decisive_zero(table: dict[int, float]) -> bool:
    """0 workers measured so much faster than every worker count that no window's move can change the choice
    (:data:`QUICK_WINDOW_SPREAD`)."""
    with_workers = [r for w, r in table.items() if w > 0 and r > 0]
    spread = (1 + QUICK_WINDOW_SPREAD) / (1 - QUICK_WINDOW_SPREAD)
    return bool(with_workers) and table.get(0, 0.0) > max(with_workers) * ZERO_WORKERS_MARGIN * spread


def _decide(
    table: dict[int, float], windows: dict[int, dict[str, Any]], tolerance: float, user: int, limit: int,
    small: int | None, sample_s: float | None, elapsed: float,
) -> WorkerProbe:  # fmt: skip
    timed = {w: r for w, r in table.items() if r > 0}
    probe = WorkerProbe(user, dict(sorted(table.items())), elapsed, limit, user_workers=user,
                        probe_batch_size=small, sample_ms=None if sample_s is None else 1000 * sample_s,
                        windows=dict(sorted(windows.items())))  # fmt: skip
    if len(timed) < 2:
        probe.conclusive = False
        probe.reason = (
            f"Could not rank worker counts within the budget ({len(timed)} of {len(table)} measured counts "
            f"completed a timed window): keeping num_workers={user}. Raise workers_budget_s to measure."
        )
        return probe
    choice = _choose(timed, tolerance)
    if choice < user:
        if user not in timed:
            probe.conclusive = False
            probe.reason = (
                f"num_workers={user} (yours) could not be timed within the budget, so no smaller count is known "
                f"to be faster: keeping num_workers={user}."
            )
            return probe
        if timed[choice] <= timed[user]:
            probe.reason = (
                f"num_workers={choice} is within {100 * tolerance:.0f} % of the best but not faster than yours: "
                f"keeping num_workers={user}."
            )
            return probe
    probe.num_workers = choice
    fastest = max(timed, key=timed.__getitem__)
    if fastest != choice:  # a rule chose, not the table alone: the probe says which
        figures = f"{timed[fastest]:.1f} against {timed[choice]:.1f} batches/s"
        probe.reason = (
            f"0 workers loaded faster alone ({figures}) but not {ZERO_WORKERS_MARGIN:g}x faster, and loading in the "
            f"training process stalls every step: num_workers={choice}" if fastest == 0 else
            f"num_workers={choice} is the smallest count within {100 * tolerance:.0f} % of the fastest "
            f"(num_workers={fastest}: {figures})"
        )  # fmt: skip
    return probe


def decide_workers_again(probe: WorkerProbe | None, loader: Any, proposal: int, reason: str, who: str,
                         apply: Callable[[int], None], tolerance: float = 0.03,
                         training_batches_s: float | None = None,
                         restart: Callable[[Any], None] | None = None,
                         spanning: Any = None) -> tuple[int, str]:  # fmt: skip
    """A worker count ``who`` chose, decided again in training (the run record's ``decide_again``): ``reason`` says
    what training showed, ``proposal`` the count it points to. The count changes (``apply(proposal)``, from the next
    epoch) where it cannot starve training: ``probe`` measured it as good as the current one for the loader alone,
    or, for fewer workers, the loader alone at the current count with one worker's share per worker taken away
    (the least fewer workers load, as each loads at most its share) still makes :data:`KEEP_UP_MARGIN` more batches
    per second than training takes (``training_batches_s``). Where a SpanningLoader keeps the workers across
    epochs (``spanning``, from the data path's record of ``loader``), ``restart(spanning)`` is asked to start them
    again at the next epoch with the new count (no ``restart``: the count stays). Returns the count in force and the sentence to log."""
    current = loader.num_workers
    good, figures = probe.as_good(proposal, current, tolerance) if probe is not None else (False, "no probe ran")
    if not good and probe is not None and 0 < proposal < current and training_batches_s and current in probe.table:
        least = probe.table[current] * proposal / current
        if least >= training_batches_s * (1 + KEEP_UP_MARGIN):
            good = True
            figures = (f"the loader alone made {probe.table[current]:.1f} batches/s at {current} workers, so {proposal} "
                       f"make at least {least:.1f}, and training takes {training_batches_s:.1f}")  # fmt: skip
        else:
            figures += (f"; {proposal} workers could make as few as {least:.1f} batches/s, and training takes "
                        f"{training_batches_s:.1f}")  # fmt: skip
    if spanning is not None and (restart is None or not good):
        why = figures if not good else "a new count would restart them"
        return current, f"{who} keeps num_workers={current}: {reason}, but its workers load across epoch ends " \
            f"(SpanEpochs): {why}."
    if not good:
        return current, f"{who} keeps num_workers={current}: {reason}, but fewer workers would load slower ({figures})."
    apply(proposal)
    if spanning is not None:
        restart(spanning)  # type: ignore[misc]
    return proposal, (f"{who} decided again: num_workers {current} -> {proposal} from the next epoch, because {reason}; "
                      f"{figures}.")  # fmt: skip


#: fewer workers are taken in training only where they would still make this share more batches per second than
#: training takes (they lose at most their share of the loader's rate)
KEEP_UP_MARGIN = 0.1
