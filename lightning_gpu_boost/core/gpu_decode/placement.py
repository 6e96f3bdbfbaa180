"""Where the JPEGs are decoded, by measurement (``decode="auto"``): the training run itself is timed with the
workers decoding every sample (GPU share 0), with the GPU decoding every sample (share 1), with a split that
leaves the workers a share they can make faster than the GPU decode trained (share
``1 - rate_cpu * worker_cpus / (rate_gpu * (1 + headroom))``, ``worker_cpus`` the share of the CPUs the workers keep
during a split; timed twice where its first window beats share 1, and its slower
window counts), and with the CPU decode and share 1 once more where another share was faster (the CPU decode's
first window opens the run; share 1's slower window counts): a window can read several percent off its share's
steady rate. The split is kept over share 1 only where its slower window beats share 1's better one by the noise
margin (H200, ResNet-50: the split read 17.1 and 17.6 batches/s, share 1 15.9 just after the CPU decode's window and
17.6 later; the split then trained at 15.0, share 1 at 17.0); the GPU share kept must beat the CPU decode's better
window by the margin, else the CPU decode is kept. Each doubt settles on the placement with less at stake: share 1
over a split (another H200 host, ResNet-50: GPU share 0.3 trained at 0.77-0.81 of the ceiling, share 1 at 0.92), the
CPU decode over a GPU share; the decision says why. The split has
headroom because at the share where the workers just keep up with ``rate_gpu`` the step can go no faster than at
share 1 and waits for the workers at every slower batch (H200, ResNet-50: 15.2 batches/s there, 16.9 at share 1); a
split trains faster than share 1 only where the GPU's decode slows the step more than the workers' decode slows the
training process's CPU threads.

A share takes effect as the workers' batches made after the change arrive: each record carries the share its worker
read, and a window starts at the first batch made wholly under the new share, plus the batches held ahead (the
loader's queue, the prefetcher's look-ahead); the time of an epoch's end or a validation run is not counted, nor the
batches queued during it. A queue can outlast that settle: where the workers make batches only a little slower than
the step takes them, it drains for hundreds of batches (H200, ResNet-50: the CPU decode's window read 18.2
batches/s, its workers made 15.1). So a window's rate is the lower of the step's (batches over the time they took)
and the workers' (where the batches say when and by which worker they were made: the workers seen, over the mean
time a worker took from one of its batches to its next, between the same breaks: a window goes on across an epoch's
end, where a worker waits for the next epoch's work). Each worker's own pace is read because workers that start
together (at the run's start, or when a share change reaches them) finish their batches together: the time between
the window's first and last batch measures how those bursts fall in the window, not the pace. Each window's figures
are kept (:attr:`Decision.windows`).

Under DDP every rank runs the same search on the same figures (:func:`agreed`): rank 0's clock and batch, with a
batch's share counted only where every rank's batch showed it. The ranks step together, so a rank still training on
the old share's batches sets the pace of rank 0's window (2 x H200, ResNet-50: share 1 read 8.95 batches/s with each
rank's own share in its window, where the GPU decode then trained at 14.9 per rank). Framework-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Decision", "DecoderChoice", "SplitSearch", "agreed", "workers_rate"]


@dataclass
class Decision:
    """What :class:`SplitSearch` chose: the GPU ``share``, the measured ``rates`` (batches/s by share), why, and
    each timed window (its share, batches, the step's and the workers' batches/s; the workers' is 0 where the batches
    did not say)."""

    share: float
    rates: dict[float, float] = field(default_factory=dict)
    why: str = ""
    windows: list[dict[str, float]] = field(default_factory=list)
    #: the share of each batch for the JPEG engines that :class:`DecoderChoice` kept (``None``: not chosen)
    engine_load: float | None = None


def workers_rate(made: list[tuple]) -> float | None:
    """Batches/s the workers made, from when (``time.monotonic()``) and by which worker each batch of a window was
    made, and optionally after how many breaks (epoch ends, validation runs): the workers seen, over the mean time a
    worker took from one of its batches to its next between the same breaks (a worker's next epoch starts when the
    loader's next iterator sends it work, after the break: 2 x H200, ResNet-50's 125-batch epochs under DDP, the
    workers read 7.3 batches/s across the breaks where the step took 14.9); batches that do not name their worker
    count as one worker's; ``None`` where no worker made two batches at distinct times between two breaks."""
    by: dict[tuple, list[float]] = {}
    for at, worker, *breaks in made:
        by.setdefault((worker, *breaks), []).append(at)
    paces = [(max(t) - min(t)) / (len(t) - 1) for t in by.values() if len(t) > 1 and max(t) > min(t)]
    workers = len({key[0] for key in by})
    return workers * len(paces) / sum(paces) if paces else None


def agreed(rows: Sequence[Sequence[float]], tolerance: float) -> tuple[float, float | None, float | None, int | None]:
    """The ranks' last batches as one step of the search: ``rows`` holds each rank's ``(now, share, made_at,
    made_by)`` (NaN where unknown), rank 0's first; rank 0's clock, share and batch, the share ``None`` unless every
    rank's batch showed it (within ``tolerance``)."""
    now, share, made_at, made_by = rows[0]
    shares = [row[1] for row in rows]
    if any(math.isnan(s) for s in shares) or max(shares) - min(shares) > tolerance:
        share = math.nan
    return (now, None if math.isnan(share) else share, None if math.isnan(made_at) else made_at,
            None if math.isnan(made_by) else int(made_by))  # fmt: skip


class SplitSearch:
    """Measure training throughput at GPU shares 0, 1 and the split, then keep the best (see the module docstring).

    Args:
        window: timed batches per share.
        settle: batches skipped after the first batch that shows a new share, and after a break: the batches the
            loader and the prefetcher hold ahead (made at a rate the window would not measure).
        margin: the relative gain over the CPU decode a share needs to be chosen.
        tolerance: how far a batch's share may be from the one asked for and count as showing it.
        max_breaks: epoch ends and validation runs after which, undecided, the CPU decode is kept.
        headroom: how much faster than the GPU decode's training rate the workers could make their share of the
            split's batches.
        worker_cpus: the share of the CPUs the workers keep during a split (they leave the rest to the training
            process), in ``(0, 1]``: their decode rate there, of the CPU decode's.

    Call :meth:`step` once per training batch with the time and the batch's share; it returns the share to set
    when it changes, and :attr:`decision` once decided.
    """

    def __init__(self, window: int = 24, settle: int = 3, margin: float = 0.03, tolerance: float = 0.02,
                 max_breaks: int = 40, headroom: float = 0.1, worker_cpus: float = 1.0) -> None:
        if window < 2 or settle < 0 or not 0 <= margin < 1:
            raise ValueError(f"window must be >= 2, settle >= 0 and margin in [0, 1), got {window}, {settle}, {margin}.")
        if max_breaks < 0:
            raise ValueError(f"max_breaks must be >= 0, got {max_breaks}.")
        if not 0 <= headroom < 1:
            raise ValueError(f"headroom must be in [0, 1), got {headroom}.")
        if not 0 < worker_cpus <= 1:
            raise ValueError(f"worker_cpus must be in (0, 1], got {worker_cpus}.")
        self.worker_cpus = worker_cpus
        self.window, self.settle, self.margin, self.tolerance = window, settle, margin, tolerance
        self.headroom = headroom
        self.max_breaks = max_breaks
        self.rates: dict[float, float] = {}
        self._best: dict[float, float] = {}  # each share's better window
        self.todo: list[float] = [0.0, 1.0]
        self.decision: Decision | None = None
        self._shown = 0  # batches in a row showing the current share
        self._n, self._time = 0, 0.0  # timed batches of the current share, and their time
        self._made: list[tuple] = []  # when and by which worker the timed batches were made, after how many breaks
        self.windows: list[dict[str, float]] = []
        self._last: float | None = None
        self._paused = False
        self._skip = 0  # batches still to skip after a break
        self._breaks = 0  # epoch ends and validation runs so far
        self._cpu_again = False
        self._split_again = False
        self._key = "share"  # what a window times, as :attr:`windows` names it

    @property
    def share(self) -> float:
        """The share being measured now (or the one decided)."""
        return self.decision.share if self.decision is not None else self.todo[0]

    def restart_window(self) -> None:
        """An epoch's end or a validation run comes before the next batch: the time until it is not counted (the
        window goes on from that batch, so epochs shorter than a window are timed across their ends)."""
        self._paused = True
        self._breaks += 1

    def step(self, now: float, batch_share: float | None, made_at: float | None = None,
             made_by: int | None = None) -> float | None:  # fmt: skip
        """One training batch ended at ``now`` (seconds); ``batch_share``: the GPU share its samples were made under
        (``None`` where they were made under several); ``made_at``, ``made_by``: when and by which worker it was
        made (the same clock as ``now``), where known; the share to set from now on where it changes, else
        ``None``."""
        if self.decision is not None:
            return None
        if self._breaks > self.max_breaks:  # epochs too short to hold a window after the queue: keep the CPU decode
            shown = ", ".join(f"{s:.2f}: {r:.2f}" for s, r in sorted(self.rates.items())) or "none"
            self.decision = Decision(0.0, dict(self.rates), f"the CPU decode is kept: {self._breaks} epoch ends or "
                                     f"validation runs came before the shares were timed (timed: {shown})",
                                     list(self.windows))  # fmt: skip
            return 0.0
        target = self.todo[0]
        rate = self._timed(now, batch_share, made_at, made_by)
        if rate is None:
            return None
        self._best[target] = max(rate, self._best.get(target, 0.0))
        if target in self.rates and target > 0.0:  # a GPU share's slower window
            self.rates[target] = min(rate, self.rates[target])
        else:  # the CPU decode's better window
            self.rates[target] = max(rate, self.rates.get(target, 0.0))
        self.todo.pop(0)
        if not self.todo and len(self.rates) == 2 and self.rates[1.0] > self.rates[0.0]:
            split = round(1.0 - self.rates[0.0] * self.worker_cpus / (self.rates[1.0] * (1 + self.headroom)), 2)
            if 0.05 <= split <= 0.95:
                self.todo.append(split)
        elif not self.todo and 0.0 < target < 1.0 and not self._split_again and rate > self.rates[1.0]:
            # a split's first window follows the change from share 1 and read faster than the split then trained
            # (H200, ResNet-50: 16.8 batches/s, then 15.6 steady, below share 1's 16.2): it is timed once more
            self._split_again = True
            self.todo.append(target)
        if not self.todo and not self._cpu_again and max(self.rates.values()) > self.rates[0.0]:
            # the CPU decode's first window opens the run (workers starting, caches cold: on the H200 it read half
            # of its steady rate): it is timed again before another share is chosen over it
            self._cpu_again = True
            self.todo.append(0.0)
            if self.rates[1.0] > self.rates[0.0]:
                # share 1's one window can read high as well (H200, ResNet-50: 17.6 batches/s, then 16.8 steady
                # against the CPU decode's 17.4): it is timed again too, and its slower window counts
                self.todo.append(1.0)
        if self.todo:
            return self.todo[0]
        self.decision = self._decide()
        return self.decision.share

    def _timed(self, now: float, shown: float | None, made_at: float | None, made_by: int | None) -> float | None:
        """Count one batch towards the window of the candidate being timed (``self.todo[0]``; ``shown``: the
        candidate the batch was made under, ``None`` where several): the window's rate once it is full (recorded in
        :attr:`windows`; the window starts again), else ``None``."""
        target = self.todo[0]
        last, paused = self._last, self._paused
        self._last, self._paused = now, False
        if shown is None or abs(shown - target) > self.tolerance:
            self._shown, self._n, self._time, self._made = 0, 0, 0.0, []
            return None
        self._shown += 1
        if paused:  # an epoch's end or validation: the interval is not counted, nor the queue it let fill
            self._skip = self.settle + 1
        if self._shown <= self.settle + 1 or last is None or self._skip > 0:  # settling
            self._skip = max(0, self._skip - 1)
            return None
        self._n += 1
        self._time += now - last
        if made_at is not None:
            self._made.append((made_at, made_by, self._breaks))
        if self._n < self.window:
            return None
        stepped = self._n / max(self._time, 1e-9)
        made = workers_rate(self._made) if len(self._made) == self._n else None
        rate = stepped if made is None else min(stepped, made)  # the workers' rate, where slower
        self.windows.append({self._key: target, "batches": self._n, "step_batches_s": stepped,
                             "workers_batches_s": made or 0.0})  # fmt: skip
        self._shown, self._n, self._time, self._made = 0, 0, 0.0, []
        return rate

    def _decide(self) -> Decision:
        cpu = self.rates[0.0]
        splits = [s for s in self.rates if 0.0 < s < 1.0]
        # a split (the workers and the GPU both decoding) is kept over share 1 only where its slower window beats
        # share 1's better one by the margin
        whole = self._best.get(1.0, self.rates[1.0])
        best = splits[0] if splits and self.rates[splits[0]] >= whole * (1 + self.margin) else 1.0
        shown = ", ".join(f"{s:.2f}: {r:.2f}" for s, r in sorted(self.rates.items()))
        if self.rates[best] >= cpu * (1 + self.margin):
            why = (f"the GPU decodes {best:.0%} of the samples: {self.rates[best] / cpu:.2f}x the CPU decode's "
                   f"training batches/s (by GPU share: {shown})")  # fmt: skip
            if splits and best == 1.0 and self.rates[splits[0]] > self.rates[1.0]:
                why += (f"; the split at {splits[0]:.2f} was not kept: not {self.margin:.0%} over share 1's better "
                        f"window ({whole:.2f})")  # fmt: skip
            return Decision(best, dict(self.rates), why, list(self.windows))
        why = (f"the CPU decode is kept: no GPU share was more than {self.margin:.0%} faster (training batches/s by "
               f"GPU share: {shown})")  # fmt: skip
        return Decision(0.0, dict(self.rates), why, list(self.windows))


class DecoderChoice(SplitSearch):
    """After :class:`SplitSearch` placed a GPU share that DALI decodes on the JPEG engines: the training timed with
    nvJPEG's CUDA decoder in their place (engine load 0: each JPEG's Huffman codes decoded on DALI's CPU threads, the
    rest in CUDA kernels), in two windows whose slower one counts; it is kept where that is at least the engines'
    slower window at the share, else the engines stay. Like for like and without a margin: both are GPU decoders
    whose slower window beat the CPU decode's faster one by the search's margin, so either keeps the run above the
    CPU decode. Its slower window against their faster one plus the margin would ask the CUDA decoder for about
    6 %, its whole lead with ResNet-50 on an H200 (0.98 of the ceiling, the engines 0.91-0.92): a coin's toss.
    The engines decode beside the multiprocessors, but their images take a conversion kernel each
    (H200, ResNet-50: 1.1 ms of the GPU's time a step); the CUDA decoder takes the step less GPU time and the host
    more CPU time (``DALIDataModule``'s decode, the engines idle: 0.8 ms a step, 8 CPU cores at 4,700 img/s), and
    decodes fewer JPEGs a second (H200: 10.5k against 20-22k), too few for a fast step.

    Where the search kept the CPU decode and DALI would decode on a GPU, the CUDA decoder decoding every sample is
    timed the same way against the CPU decode's better window (:meth:`against_cpu`): the engines losing to the
    CPU decode did not make the CUDA decoder lose (H200, ResNet-50: the engines trained at 0.91-0.92 of the
    ceiling on every host, the CUDA decoder at 0.984, the CPU decode at 0.73-0.95 by host); kept only by the margin,
    else the CPU decode stays.

    Args:
        placed: the split search's decision (a GPU share above 0), or the share the CUDA decoder is timed at.
        engines_rate: training batches/s at that share with the engines (its slower window); with ``against``:
            the CPU decode's (its better window).
        window, settle, margin, tolerance, max_breaks: as :class:`SplitSearch`'s.
        against: the search's decision to keep the CPU decode, where the CUDA decoder challenges it (it stands
            unless the CUDA decoder beats ``engines_rate`` by the margin).

    Call :meth:`step` once per training batch with the time and the engine load its JPEGs were decoded with
    (``None`` where unknown); it returns the load to set once decided, and :attr:`decision` (the placed share, with
    :attr:`Decision.engine_load`) then.
    """

    def __init__(self, placed: Decision, engines_rate: float, window: int = 24, settle: int = 3,
                 margin: float = 0.03, tolerance: float = 0.02, max_breaks: int = 40,
                 against: Decision | None = None) -> None:  # fmt: skip
        super().__init__(window=window, settle=settle, margin=margin, tolerance=tolerance, max_breaks=max_breaks)
        if placed.share <= 0.0:
            raise ValueError(f"placed.share must be above 0 (the GPU decodes a share), got {placed.share}.")
        if not engines_rate > 0.0:
            raise ValueError(f"engines_rate must be above 0, got {engines_rate}.")
        if against is not None and against.share != 0.0:
            raise ValueError(f"against must be a decision to keep the CPU decode (share 0), got {against.share}.")
        self.placed, self.engines_rate, self.against = placed, engines_rate, against
        self.todo = [0.0, 0.0]  # the CUDA decoder (engine load 0), twice
        self._key = "engine_load"

    @classmethod
    def after(cls, search: SplitSearch) -> DecoderChoice:
        """The choice that follows ``search``'s decision (a GPU share above 0), timed as it timed its windows."""
        assert search.decision is not None
        share = search.decision.share
        # the share's slower window: a GPU share is placed only from the rates, so its rate is there
        return cls(search.decision, search.decision.rates[share], search.window,
                   search.settle, search.margin, search.tolerance, search.max_breaks)  # fmt: skip

    @classmethod
    def against_cpu(cls, search: SplitSearch) -> DecoderChoice:
        """The CUDA decoder decoding every sample, timed against the CPU decode that ``search`` kept (its better
        window), as the search timed its windows."""
        kept = search.decision
        assert kept is not None and kept.share == 0.0
        placed = Decision(1.0, dict(kept.rates), "the GPU decodes 100% of the samples", list(kept.windows))
        return cls(placed, kept.rates[0.0], search.window, search.settle, search.margin, search.tolerance,
                   search.max_breaks, against=kept)  # fmt: skip

    @property
    def share(self) -> float:
        """The GPU share placed (timed with each decoder)."""
        return self.placed.share

    @property
    def engine_load(self) -> float:
        """The engine load being timed now (or the one kept)."""
        return self.decision.engine_load if self.decision is not None else self.todo[0]  # type: ignore[return-value]

    def step(self, now: float, batch_load: float | None, made_at: float | None = None,
             made_by: int | None = None) -> float | None:  # fmt: skip
        """One training batch ended at ``now``; ``batch_load``: the engine load its JPEGs were decoded with; the
        engine load to set once decided, else ``None``."""
        if self.decision is not None:
            return None
        if self._breaks > self.max_breaks:
            if self.against is not None:
                return self._stand(f"{self._breaks} epoch ends or validation runs came before nvJPEG's CUDA "
                                   "decoder was timed")  # fmt: skip
            return self._keep(1.0, f"the JPEG engines are kept: {self._breaks} epoch ends or validation runs came "
                                   "before nvJPEG's CUDA decoder was timed")  # fmt: skip
        rate = self._timed(now, batch_load, made_at, made_by)
        if rate is None:
            return None
        self.rates[0.0] = min(rate, self.rates.get(0.0, rate))
        self.todo.pop(0)
        if self.todo:
            return None
        cuda, ratio = self.rates[0.0], self.rates[0.0] / self.engines_rate
        if self.against is not None:
            if cuda >= self.engines_rate * (1 + self.margin):
                return self._keep(0.0, f"nvJPEG's CUDA decoder decodes them: {ratio:.2f}x the CPU decode's "
                                       f"training batches/s ({cuda:.2f} against {self.engines_rate:.2f}), where "
                                       f"the JPEG engines were not {self.margin:.0%} faster")  # fmt: skip
            return self._stand(f"nvJPEG's CUDA decoder decoding every sample trained at {ratio:.2f}x the CPU decode's "
                               f"batches/s ({cuda:.2f} against {self.engines_rate:.2f}), not {self.margin:.0%} faster")
        if cuda >= self.engines_rate:  # the slower windows of both
            return self._keep(0.0, f"nvJPEG's CUDA decoder decodes in place of the JPEG engines: {ratio:.2f}x "
                                   f"their training batches/s ({cuda:.2f} against {self.engines_rate:.2f})")  # fmt: skip
        return self._keep(1.0, f"the JPEG engines are kept: nvJPEG's CUDA decoder trained at {ratio:.2f}x their "
                               f"batches/s ({cuda:.2f} against {self.engines_rate:.2f})")  # fmt: skip

    def _stand(self, why: str) -> float:
        """The CPU decode the search kept stays (the challenge lost, or was not timed): the GPU share 0."""
        assert self.against is not None
        self.decision = Decision(0.0, dict(self.against.rates), f"{self.against.why}; {why}",
                                 self.against.windows + self.windows)  # fmt: skip
        return 0.0

    def _keep(self, load: float, why: str) -> float:
        self.decision = Decision(self.placed.share, dict(self.placed.rates), f"{self.placed.why}; {why}",
                                 self.placed.windows + self.windows, engine_load=load)  # fmt: skip
        return load
