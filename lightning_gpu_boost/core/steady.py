"""The one timing rule: every throughput figure is taken in the loader's steady state, and says whether it was.

A DataLoader with ``num_workers`` workers can hold ``num_workers x prefetch_factor`` finished batches when timing
starts (filled while the model warmed up: cuDNN autotuning, compilation, a worker probe). A window that is short
next to that queue times the queue, not the loader. So every timed case here:

1. skips at least the loader's queue plus :data:`EXTRA_WARMUP` steps (:func:`min_warmup`), whatever warm-up the
   caller asked for;
2. records when each step (or batch) ended, and splits the window into halves: where the first and second half
   differ by more than :data:`STEADY_TOLERANCE`, the window's start moves later (:func:`steady_window`: "until the
   per-step rate is stable"), never below half of the timed steps; where no later start is steady, the figure is
   reported with ``steady=False`` and the outputs flag it;
3. records the queue size, the warm-up and timed steps, and the halves' rates with the figure
   (:meth:`SteadyRate.as_dict`).

Nothing here needs a Trainer or CUDA: the ``ThroughputMeter`` callback, ``doctor``, the worker probe, the bench
and demo CLIs and the scripts under ``benchmarks/`` all time through it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ['EXTRA_WARMUP', 'MIN_WINDOW_STEPS', 'ResidentBatches', 'STEADY_TOLERANCE', 'ShortWindow', 'SteadyRate', 'TimedIterable', 'batch_size_of', 'min_warmup', 'queue_batches', 'steady_window', 'whole_epoch_rates', 'worst_halves_diff']

#: steps beyond the loader's queue that are never timed
EXTRA_WARMUP = 4
#: the fewest steps a window holds (each half at least half of it)
MIN_WINDOW_STEPS = 8
#: the largest relative difference between the halves' rates of a steady figure
STEADY_TOLERANCE = 0.05


def batch_size_of(batch: Any) -> int:
    """Samples in ``batch``: the first dimension of its first tensor (in a tensor, list, tuple or dict)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if isinstance(batch, dict) and batch:
        return batch_size_of(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size_of(batch[0])
    return 1


def queue_batches(loader: Any) -> int:
    """Finished batches ``loader`` can hold before the consumer asks for them.

    A DataLoader: ``num_workers x prefetch_factor``; a wrapper with ``depth`` and ``loader`` (StreamPrefetcher):
    its depth plus the inner loader's queue; a DALI loader: its ``prefetch_queue_depth``; a list or dict of
    loaders: the largest; anything else: 0.
    """
    if isinstance(loader, dict):
        return max((queue_batches(v) for v in loader.values()), default=0)
    if isinstance(loader, (list, tuple)):
        return max((queue_batches(v) for v in loader), default=0)
    workers = getattr(loader, "num_workers", None)
    if isinstance(workers, int) and hasattr(loader, "prefetch_factor"):
        return workers * int(loader.prefetch_factor or 0) if workers > 0 else 0
    if hasattr(loader, "loader") and loader is not getattr(loader, "loader", None):
        return int(getattr(loader, "depth", 0) or 0) + queue_batches(loader.loader)
    depth = getattr(loader, "prefetch_queue_depth", None)
    if isinstance(depth, int):
        return depth
    if isinstance(depth, dict):
        return max((int(v) for v in depth.values()), default=0)
    iterables = getattr(loader, "iterables", None)  # Lightning's CombinedLoader
    if iterables is not None and iterables is not loader:
        return queue_batches(iterables)
    return 0


def min_warmup(queue: int, warmup: int = 0) -> int:
    """Untimed steps: the caller's ``warmup``, but never fewer than the queue plus :data:`EXTRA_WARMUP`."""
    return max(int(warmup), int(queue) + EXTRA_WARMUP)


@dataclass
class SteadyRate:
    """A rate taken over a window of steps, with what shows whether it was steady.

    ``rate``, ``first_half`` and ``second_half`` are units (samples or batches) per second.
    """

    rate: float
    first_half: float
    second_half: float
    queue: int
    warmup: int
    timed: int
    seconds: float

    @property
    def halves_diff(self) -> float:
        """Relative difference of the halves' rates (``nan`` without a window)."""
        hi = max(self.first_half, self.second_half)
        return abs(self.first_half - self.second_half) / hi if hi > 0 else float("nan")

    @property
    def steady(self) -> bool:
        return self.timed > 0 and self.halves_diff <= STEADY_TOLERANCE

    def as_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate, "first_half": self.first_half, "second_half": self.second_half,
            "halves_diff": self.halves_diff, "steady": self.steady, "queue_batches": self.queue,
            "warmup_steps": self.warmup, "timed_steps": self.timed, "window_s": self.seconds,
        }  # fmt: skip

    def flag(self) -> str:
        """``""`` when steady, else a short mark for tables: ``" (not steady: halves 12 % apart)"``."""
        if self.steady:
            return ""
        if self.timed == 0:
            return " (no timed window)"
        return f" (not steady: halves {100 * self.halves_diff:.0f} % apart)"


def _rate(units: Sequence[float], times: Sequence[float], start: int, end: int) -> float:
    """Units of steps ``start+1 .. end`` over the time between their ends (``times[i]``: end of step ``i``)."""
    seconds = times[end] - times[start]
    return sum(units[start + 1 : end + 1]) / seconds if seconds > 0 else float("inf")


def whole_epoch_rates(edges: Sequence[float], samples: Sequence[float]) -> dict[str, Any]:
    """Samples per second over whole epochs, their starts included (for epochs too short to hold a steady window:
    ``doctor``'s trial fits, the workloads' runner): epoch ``i`` of those timed ran from ``edges[i]`` to
    ``edges[i + 1]`` with ``samples[i]``; the halves are the first and the last half of them."""
    n, half = len(samples), len(samples) // 2

    def rate(a: int, b: int) -> float:  # epochs a..b-1
        seconds = edges[b] - edges[a]
        return sum(samples[a:b]) / seconds if seconds > 0 else float("nan")

    whole = rate(0, n) if n else float("nan")
    a, b = (rate(0, half), rate(n - half, n)) if half else (float("nan"), float("nan"))
    diff = abs(a - b) / max(a, b) if half and max(a, b) > 0 else float("nan")
    return {"measured": "whole epochs", "samples_per_s": whole, "epochs_timed": n, "first_half": a,
            "second_half": b, "halves_diff": diff, "steady": diff <= STEADY_TOLERANCE,
            "window_s": edges[n] - edges[0] if n else 0.0}  # fmt: skip


def steady_window(
    times: Sequence[float],
    units: Sequence[float] | None = None,
    warmup: int = 0,
    queue: int = 0,
    min_steps: int = MIN_WINDOW_STEPS,
) -> SteadyRate:
    """The rate over the steps after the warm-up, in steady state.

    Args:
        times: ``times[i]`` is when step ``i`` ended; ``times[0]`` is the reference before step 1 (e.g. the
            end of step 0, or when iteration started).
        units: units per step (``units[i]`` for step ``i``; ``units[0]`` is ignored); 1 per step by default.
        warmup: the least number of steps skipped; :func:`min_warmup` of ``queue`` is applied on top.
        queue: the loader's queue in batches (:func:`queue_batches`).
        min_steps: the fewest steps a window holds.

    The window first opens after ``min_warmup(queue, warmup)`` steps. Where its halves differ by more than
    :data:`STEADY_TOLERANCE`, its start moves later in eighths of the remaining steps, keeping at least half of
    them (and ``min_steps``); the first start whose halves agree is used, else the first one, flagged.
    """
    n = len(times) - 1
    units = [1.0] * (n + 1) if units is None else list(units)
    start = min_warmup(queue, warmup)
    if n - start < max(2, min_steps):
        # too short for the rule: time what there is after the caller's warm-up, never called steady
        start = min(int(warmup), max(0, n - 2))
        if n - start < 2:
            return SteadyRate(0.0, 0.0, 0.0, queue, start, 0, 0.0)
        short = _window(times, units, start, n, queue)
        return ShortWindow(**{k: getattr(short, k) for k in SteadyRate.__dataclass_fields__})
    first = _window(times, units, start, n, queue)
    if first.steady:
        return first
    keep = max(min_steps, (n - start + 1) // 2)
    stride = max(1, (n - start) // 8)
    for s in range(start + stride, n - keep + 1, stride):
        later = _window(times, units, s, n, queue)
        if later.steady:
            return later
    return first


class ShortWindow(SteadyRate):
    """A window shorter than the loader's queue plus the warm-up: reported, never called steady."""

    @property
    def steady(self) -> bool:
        return False

    def flag(self) -> str:
        return " (not steady: window shorter than the loader's queue + warm-up)"


def _window(times: Sequence[float], units: Sequence[float], start: int, end: int, queue: int) -> SteadyRate:
    mid = start + (end - start) // 2
    return SteadyRate(
        rate=_rate(units, times, start, end),
        first_half=_rate(units, times, start, mid),
        second_half=_rate(units, times, mid, end),
        queue=queue,
        warmup=start,
        timed=end - start,
        seconds=times[end] - times[start],
    )


def worst_halves_diff(results: Any) -> float:
    """The largest ``halves_diff`` found anywhere in ``results`` (nested dicts/lists of ``SteadyRate.as_dict``
    outputs); ``nan`` where there is none."""
    found: list[float] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            diff = value.get("halves_diff")
            if isinstance(diff, (int, float)) and not isinstance(diff, bool):
                found.append(float(diff))
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(results)
    finite = [d for d in found if not math.isnan(d)]
    return max(finite) if finite else float("nan")


class TimedIterable:
    """Iterates ``iterable`` and records when each item was asked for (``time.perf_counter()``), across
    restarts: a framework-free step clock for loops that pull one item per step (Lightning's fetcher asks for
    batch N+1 as step N starts, so the stamps are spaced by the steps)."""

    def __init__(self, iterable: Any) -> None:
        self.iterable = iterable
        self.stamps: list[float] = []
        self.units: list[float] = []

    def __len__(self) -> int:
        return len(self.iterable)

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable:
            self.stamps.append(time.perf_counter())
            self.units.append(float(batch_size_of(item)))
            yield item

    def __getattr__(self, name: str) -> Any:  # num_workers, prefetch_factor, ... of the wrapped loader
        if name == "iterable":
            raise AttributeError(name)
        return getattr(self.iterable, name)

class ResidentBatches:
    """The same batch ``length`` times per epoch: a loader that costs nothing (the ceiling's loader)."""

    def __init__(self, batch: Any, length: int) -> None:
        self.batch, self.length = batch, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return (self.batch for _ in range(self.length))
