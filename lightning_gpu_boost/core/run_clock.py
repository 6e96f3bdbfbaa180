"""Where a run's time goes outside its steps, and what its loader's workers and its stream's cache did meanwhile:
the watchdog's bookkeeping, framework-free (the callback calls these as Lightning's hooks fire).

- :class:`RunClock`: the time between steps (an epoch's end and the next one's start, validation, checkpoints), the
  share of it that later epochs' starts took (from the epoch's start to its first batch: the workers starting
  again), validation apart, and the run's wall time from its first step.
- :class:`LoaderActivity`: the workers' CPU share and the stream cache's growth, read per window and over the run
  after warm-up (busy workers make a data wait CPU-bound, a growing cache makes it a download wait).
"""

from __future__ import annotations

import time

from lightning_gpu_boost.core.worker_cpu import WorkerCPU

__all__ = ["LoaderActivity", "RunClock"]


class RunClock:
    """The run's time outside its steps. ``gap()`` marks the time up to the next step as outside the steps."""

    def __init__(self) -> None:
        self.between_s = 0.0
        self.validation_s = 0.0
        #: of ``between_s``: later epochs' starts, from the epoch's start to its first batch (the loader starting)
        self.epoch_start_s = 0.0
        self.first_start: float | None = None
        self.last_end: float | None = None
        self.end: float | None = None
        self._in_gap = True
        self._epoch_started: float | None = None
        self._val_start: float | None = None

    def gap(self) -> None:
        self._in_gap = True

    def epoch_start(self) -> None:
        self._in_gap = True
        self._epoch_started = time.perf_counter()

    def validation_start(self, sanity: bool) -> None:
        self._in_gap = True
        if not sanity:
            self._val_start = time.perf_counter()

    def validation_end(self) -> None:
        if self._val_start is not None:
            self.validation_s += time.perf_counter() - self._val_start
            self._val_start = None

    def step_start(self, batch_idx: int) -> bool:
        """A step starts now; ``True`` for the run's first step (start-up before it is paid once per fit)."""
        now, first = time.perf_counter(), False
        if self.last_end is None:
            first = self.first_start is None
            if first:
                self.first_start = now
        elif self._in_gap:  # an epoch's end (workers restart), validation, a checkpoint
            self.between_s += now - self.last_end
            if batch_idx == 0 and self._epoch_started is not None:  # a later epoch's start, to its first batch
                self.epoch_start_s += now - self._epoch_started
        self._epoch_started = None
        self._in_gap = False
        return first

    def step_end(self) -> None:
        self.last_end = time.perf_counter()

    def train_end(self) -> None:
        self.end = time.perf_counter()
        if self.last_end is not None:
            self.between_s += self.end - self.last_end  # the last validation and the end of the epoch

    def wall_s(self) -> float:
        """The run from its first step on (to its end, or to now while it runs)."""
        now = time.perf_counter()
        return (self.end if self.end is not None else now) - (self.first_start or now)


class LoaderActivity:
    """The loader's workers' CPU share and the stream cache's growth (``growth``: a ``CacheGrowth`` per reading, or
    ``None`` for a loader that does not stream), per window and over the run."""

    def __init__(self, workers: int = 0, growth: tuple = (None, None)) -> None:
        self.workers = workers
        self._window_cpu, self._run_cpu = WorkerCPU(), WorkerCPU()
        self._window_growth, self._run_growth = growth
        self.window: tuple[float | None, float | None] = (None, None)
        self.run: tuple[float | None, float | None] | None = None

    def start_window(self) -> None:
        self._window_cpu.busy_share(self.workers)
        if self._window_growth is not None:
            self._window_growth.bytes_per_s()

    def close_window(self) -> tuple[float | None, float | None]:
        """The window's workers' busy share and the cache's bytes/s since :meth:`start_window` (read once each)."""
        self.window = (self._window_cpu.busy_share(self.workers),
                       self._window_growth.bytes_per_s() if self._window_growth is not None else None)  # fmt: skip
        return self.window

    def start_run(self) -> None:
        """The run's readings count from here (again at the end of warm-up)."""
        self._run_cpu.busy_share(self.workers)
        if self._run_growth is not None:
            self._run_growth.bytes_per_s()

    def close_run(self) -> tuple[float | None, float | None]:
        if self.run is None:
            self.run = (self._run_cpu.busy_share(self.workers),
                        self._run_growth.bytes_per_s() if self._run_growth is not None else None)  # fmt: skip
        return self.run
