"""Step timing without synchronizing: CUDA events at the step's edges, read one step late; host clocks too.

For each step N the timer records an event when the step starts and one when it ends on the compute stream.
``start(N) - end(N-1)`` is the GPU's idle gap before step N: time the stream had nothing to run because the host
was still fetching (or copying) the batch. Events are read only once ``query()`` says they completed, so the
timer never blocks the host. Gaps that contain validation, checkpointing or an epoch boundary are dropped via
:meth:`StepTimer.skip_next_gap`.

The per-step cost is kept to two event records: the stream is looked up once (``Event.record()`` without one asks
``torch.cuda.current_stream()``, which checks the device and CUDA's availability every time: most of the watchdog's
0.2 ms a step under cProfile on the H100; with the stream looked up once, 0.09-0.12 ms on the H200), and events are
reused once read. Completed events are read every ``read_every`` steps (the watchdog: 4), and the last completed
one is found by a binary search (events on one stream complete in order): a query costs about 10 us on the H100, as
much as a record, and one a step was a tenth of the hooks' time on a launch-bound step.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

__all__ = ['StepTimer', 'StepTiming']


@dataclass
class StepTiming:
    """One training step: host-side wait before it, host-side duration, and (on CUDA) the GPU's view."""

    step: int
    host_wait_ms: float
    host_step_ms: float
    gpu_gap_ms: float | None = None
    gpu_step_ms: float | None = None

    @property
    def wait_ms(self) -> float:
        """Data wait: the GPU's idle gap where measured, else the host's wait."""
        return self.gpu_gap_ms if self.gpu_gap_ms is not None else self.host_wait_ms

    @property
    def busy_ms(self) -> float:
        return self.gpu_step_ms if self.gpu_step_ms is not None else self.host_step_ms


class StepTimer:
    """Records step edges; completed :class:`StepTiming` s come out of :meth:`pop_ready`, in order.

    Args:
        cuda: record CUDA events besides host clocks, on the stream current at the first step (the training
            step's stream: Lightning runs it on the device's current stream).
        read_every: on CUDA, :meth:`pop_ready` reads the completed events once every ``read_every`` calls
            (``>= 1``; in between it returns nothing): the timings come out up to that many steps late, in order.
    """

    def __init__(self, cuda: bool, read_every: int = 1) -> None:
        if isinstance(read_every, bool) or not isinstance(read_every, int) or read_every < 1:
            raise ValueError(f"read_every must be an int >= 1, got {read_every!r}.")
        self.cuda = cuda
        self.read_every = read_every
        self._calls = 0
        self._stream: object = None
        self._free: list[object] = []  # events already read, recorded again
        self._pending: deque[tuple[StepTiming, object, object, object]] = deque()
        self._last_end_host: float | None = None
        self._last_end_event: object = None
        self._start_host = 0.0
        self._start_event: object = None
        self._prev_end_event: object = None
        self._skip_gap = True
        self._wait_ms = 0.0

    def skip_next_gap(self) -> None:
        """Don't count the gap before the next step (validation, checkpoint, epoch boundary ran in it)."""
        self._skip_gap = True

    def step_start(self) -> None:
        now = time.perf_counter()
        skip = self._skip_gap or self._last_end_host is None
        self._wait_ms = float("nan") if skip else 1000 * (now - self._last_end_host)
        self._start_host = now
        self._prev_end_event = None if skip else self._last_end_event
        if self.cuda:
            self._start_event = self._record()
        self._skip_gap = False

    def _record(self) -> object:
        """An event (a free one, else a new one) recorded on the step's stream now."""
        if self._free:
            event = self._free.pop()
        else:
            import torch

            if self._stream is None:
                self._stream = torch.cuda.current_stream()
            event = torch.cuda.Event(enable_timing=True)
        event.record(self._stream)  # type: ignore[attr-defined]
        return event

    def step_end(self, step: int) -> None:
        now = time.perf_counter()
        timing = StepTiming(step, self._wait_ms, 1000 * (now - self._start_host))
        end_event = self._record() if self.cuda else None
        self._pending.append((timing, self._prev_end_event, self._start_event, end_event))
        self._last_end_host, self._last_end_event = now, end_event

    def pop_ready(self, flush: bool = False) -> list[StepTiming]:
        """Timings whose events completed (all of them without CUDA); never blocks. On CUDA, only every
        ``read_every``-th call reads them, unless ``flush``."""
        if not self.cuda:
            ready = [timing for timing, *_ in self._pending]
            self._pending.clear()
            return ready
        self._calls += 1
        if not self._pending or (self._calls < self.read_every and not flush):
            return []
        self._calls = 0
        # the newest completed end: on one stream, events complete in the order they were recorded
        low, high = 0, len(self._pending)  # pending[:low] completed; pending[high:] did not
        while low < high:
            mid = (low + high) // 2
            if self._pending[mid][3].query():
                low = mid + 1
            else:
                high = mid
        ready = []
        for _ in range(low):
            timing, prev_end, start, end = self._pending.popleft()
            if end is not None:
                timing.gpu_step_ms = start.elapsed_time(end)
                timing.gpu_gap_ms = prev_end.elapsed_time(start) if prev_end is not None else float("nan")
                # read for good: the start, and the end before it (this step's end is the next gap's start)
                self._free.append(start)
                if prev_end is not None:
                    self._free.append(prev_end)
            ready.append(timing)
        return ready
