"""NVML sampling of this process's GPU in a background thread (no-op where NVML or a GPU is missing).

Utilization comes from ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES, last_timestamp)`` (the driver's own
buffered samples, cheap to poll, each kept with the driver's time stamp), falling back to
``nvmlDeviceGetUtilizationRates``. Either is "share of time any kernel ran" over the driver's sample period (1/6 s
to 1 s): coarse, not SM occupancy, and a window needs several periods after it opens to be read
(:meth:`NVMLSampler.sample_period`, ``mean_util(settle=True)``).

SM activity comes from NVML's GPU performance monitoring (GPM, Hopper and newer): ``NVML_GPM_METRIC_SM_UTIL``
between two GPM samples, one per poll, is the share of the SMs that were busy: a GPU can read 100 % utilization
with most SMs idle (small kernels). Where the GPU or driver has no GPM, :attr:`NVMLSampler.sm_reason` says so and
:meth:`NVMLSampler.mean_sm_active` is ``None``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any

__all__ = ['NVMLSampler', 'nvml_device']

log = logging.getLogger(__name__)


#: every NVML GPM call of this process, one at a time: two samplers sampling GPM from two threads at once (the
#: watchdog's beside ThroughputMeter's) segfaulted in ``nvmlGpmSampleGet`` on the H200 machine (driver 580)
_GPM_LOCK = threading.Lock()


def nvml_device(cuda_index: int) -> int | str:
    """NVML device (index or UUID) of CUDA device ``cuda_index`` of this process, honouring
    ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-``/``MIG-`` UUIDs)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible or cuda_index >= len(visible):
        return cuda_index
    entry = visible[cuda_index]
    return int(entry) if entry.isdigit() else entry


class NVMLSampler:
    """Samples GPU utilization (%) and memory use of one GPU every ``interval`` seconds in a daemon thread.

    Where NVML is not installed, not permitted, on a MIG slice (no utilization counters), or no GPU exists,
    :attr:`available` is ``False``, one info line says why, and nothing is sampled. It never raises into
    training and its thread stops in :meth:`stop` (also used as a context manager).

    Args:
        cuda_index: this process's CUDA device index (``torch.cuda.current_device()``).
        interval: seconds between polls, ``> 0``.
        keep: samples kept (a ring buffer).

    Example::

        >>> with NVMLSampler(cuda_index=0, interval=0.05) as sampler:
        ...     pass
        >>> sampler.mean_util() is None or 0 <= sampler.mean_util() <= 100
        True
    """

    def __init__(self, cuda_index: int = 0, interval: float = 0.1, keep: int = 100_000) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}.")
        self.cuda_index = cuda_index
        self.interval = interval
        #: (monotonic time, utilization %) pairs
        self.util: deque[tuple[float, float]] = deque(maxlen=keep)
        #: (monotonic time, SM activity %) pairs, where GPM works
        self.sm: deque[tuple[float, float]] = deque(maxlen=keep)
        #: why SM activity is not sampled ("" where it is)
        self.sm_reason = "not started"
        #: the GPM errors met (a transient one starts a fresh pair of samples)
        self.sm_errors: deque[str] = deque(maxlen=20)
        self._gpm: list[Any] = []
        self._gpm_have = False
        self._gpm_failures = 0
        self.memory_used = 0
        self.memory_total = 0
        self.available = False
        self.reason = ""
        self._nvml = None
        self._handle = None
        self._last_ts = 0
        self._periods: deque[float] = deque(maxlen=64)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _open(self) -> bool:
        try:
            import pynvml

            pynvml.nvmlInit()
            target = nvml_device(self.cuda_index)
            if isinstance(target, int):
                handle = pynvml.nvmlDeviceGetHandleByIndex(target)
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(target)
            pynvml.nvmlDeviceGetUtilizationRates(handle)  # raises on MIG slices and without permission
            self._nvml, self._handle = pynvml, handle
            return True
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (pip install 'lightning-gpu-boost[nvml]')"
        except Exception as err:  # NVMLError: no driver, no permission, MIG, unknown device
            self.reason = f"NVML: {err}"
        return False

    def _poll(self) -> None:
        nvml, handle = self._nvml, self._handle
        now = time.monotonic()
        entries: list[tuple[float, float]] = []
        try:
            _, samples = nvml.nvmlDeviceGetSamples(handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, self._last_ts)
            fresh = sorted((s for s in samples if s.timeStamp > self._last_ts), key=lambda s: s.timeStamp)
            if fresh:
                # the driver stamps its samples in microseconds of wall time; each covers the period before it
                offset = now - time.time()
                for s in fresh:
                    if self._last_ts and self._last_ts < s.timeStamp:
                        self._periods.append((s.timeStamp - self._last_ts) / 1e6)
                    self._last_ts = s.timeStamp
                    entries.append((min(now, s.timeStamp / 1e6 + offset), float(s.sampleValue.uiVal)))
        except Exception:
            pass
        if not entries and not self._periods:  # no buffered samples on this GPU: the driver's current rate
            entries.append((now, float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        sm = self._poll_gpm(now)
        with self._lock:
            self.util.extend((t, min(100.0, max(0.0, u))) for t, u in entries)
            self.memory_used, self.memory_total = int(memory.used), int(memory.total)
            if sm is not None:
                self.sm.append((now, sm))

    def _open_gpm(self) -> None:
        nvml = self._nvml
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice:
                self.sm_reason = "this GPU has no GPM counters (NVML GPM needs Hopper or newer)"
                return
            with _GPM_LOCK:
                self._gpm = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
            self.sm_reason = ""
        except Exception as err:  # an older driver or nvidia-ml-py without GPM, no permission
            self.sm_reason = f"NVML GPM: {err}"

    def _poll_gpm(self, now: float) -> float | None:
        """SM activity (%) since the previous poll, from two GPM samples (``None`` on the first or without GPM)."""
        if not self._gpm:
            return None
        nvml = self._nvml
        try:
            with _GPM_LOCK:
                value = self._gpm_metric(nvml)
            self._gpm.reverse()  # this sample is the next one's start
            self._gpm_have, self._gpm_failures = True, 0
            return value
        except Exception as err:  # a transient error starts a fresh pair; ten in a row stop GPM for this run
            self._gpm_have, self._gpm_failures = False, self._gpm_failures + 1
            self.sm_errors.append(f"{type(err).__name__}: {err}")
            if self._gpm_failures >= 10:
                self.sm_reason = f"NVML GPM failed 10 times in a row ({err})"
                self._free_gpm()
            return None

    def _gpm_metric(self, nvml: Any) -> float | None:
        """Take a GPM sample; SM activity since the last one (under :data:`_GPM_LOCK`)."""
        nvml.nvmlGpmSampleGet(self._handle, self._gpm[1])
        if not self._gpm_have:
            return None
        get = nvml.c_nvmlGpmMetricsGet_t()
        get.version, get.numMetrics = nvml.NVML_GPM_METRICS_GET_VERSION, 1
        get.sample1, get.sample2 = self._gpm[0], self._gpm[1]
        get.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        nvml.nvmlGpmMetricsGet(get)
        return min(100.0, max(0.0, float(get.metrics[0].value))) if get.metrics[0].nvmlReturn == 0 else None

    def _free_gpm(self) -> None:
        gpm, self._gpm, self._gpm_have = self._gpm, [], False
        with _GPM_LOCK:
            for sample in gpm:
                try:
                    self._nvml.nvmlGpmSampleFree(sample)
                except Exception:
                    pass

    def _skip_history(self) -> None:
        """Start after the samples the driver buffered before this sampler started (they describe other work)."""
        try:
            _, samples = self._nvml.nvmlDeviceGetSamples(self._handle, self._nvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
            stamps = sorted(s.timeStamp for s in samples)
            self._last_ts = stamps[-1] if stamps else 0
            self._periods.extend((b - a) / 1e6 for a, b in zip(stamps[-9:-1], stamps[-8:], strict=True) if b > a)
        except Exception:
            self._last_ts = 0

    def sample_period(self) -> float | None:
        """Seconds each of the driver's utilization samples covers (the median spacing of their stamps; 1/6 s to 1 s
        depending on the GPU), or ``None`` where the driver keeps no samples."""
        with self._lock:
            periods = sorted(self._periods)
        return periods[len(periods) // 2] if periods else None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._poll()
            except Exception as err:  # never let sampling break training
                log.info("GPU utilization sampling stopped: %s", err)
                return

    def start(self) -> NVMLSampler:
        """Start sampling (idempotent)."""
        if self._thread is None:
            self.available = self._open()
            if not self.available:
                log.info("GPU utilization is not sampled (%s); timings only.", self.reason)
                return self
            self._skip_history()
            self._open_gpm()
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpu-boost-nvml", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (idempotent) and free the GPM samples."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
        self._free_gpm()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def reset(self) -> None:
        """Forget the samples taken so far (e.g. after warm-up)."""
        with self._lock:
            self.util.clear()
            self.sm.clear()

    def mean_sm_active(self, since: float | None = None, until: float | None = None) -> float | None:
        """Mean SM activity (%) of the GPM readings after ``since`` (and not after ``until``), or ``None`` where GPM
        is not sampled (:attr:`sm_reason`) or no reading falls in the window."""
        with self._lock:
            values = [v for t, v in self.sm if (since is None or t >= since) and (until is None or t <= until)]
        return sum(values) / len(values) if values else None

    def mean_util(self, since: float | None = None, settle: bool = False, until: float | None = None) -> float | None:
        """Mean utilization (%) of the samples taken after ``since`` (``time.monotonic()``), or of all; ``until``:
        and not after that time (e.g. the last step's start: what follows a run is idle). ``settle``: leave out
        the samples whose period began before ``since`` (one :meth:`sample_period` later)."""
        if settle and since is not None:
            since += self.sample_period() or 0.0
        with self._lock:
            values = [u for t, u in self.util if (since is None or t >= since) and (until is None or t <= until)]
        return sum(values) / len(values) if values else None

    def memory_fraction(self) -> float | None:
        return self.memory_used / self.memory_total if self.memory_total else None

    def __enter__(self) -> NVMLSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
