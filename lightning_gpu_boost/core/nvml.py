"""NVML sampling of this process's GPU in a background thread (no-op where NVML or a GPU is missing).

Utilization comes from ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES, last_timestamp)`` (the driver's own
buffered samples, cheap to poll), falling back to ``nvmlDeviceGetUtilizationRates``. Either is "share of time
any kernel ran" over a short window: coarse, not SM occupancy.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque

log = logging.getLogger(__name__)


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
        self.memory_used = 0
        self.memory_total = 0
        self.available = False
        self.reason = ""
        self._nvml = None
        self._handle = None
        self._last_ts = 0
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
        try:
            _, samples = nvml.nvmlDeviceGetSamples(handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, self._last_ts)
            fresh = [s for s in samples if s.timeStamp > self._last_ts]
            if fresh:
                self._last_ts = max(s.timeStamp for s in fresh)
                value = sum(float(s.sampleValue.uiVal) for s in fresh) / len(fresh)
            else:
                value = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:
            value = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        with self._lock:
            self.util.append((now, min(100.0, max(0.0, value))))
            self.memory_used, self.memory_total = int(memory.used), int(memory.total)

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
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpu-boost-nvml", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (idempotent)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def reset(self) -> None:
        """Forget the samples taken so far (e.g. after warm-up)."""
        with self._lock:
            self.util.clear()

    def mean_util(self, since: float | None = None) -> float | None:
        """Mean utilization (%) of the samples taken after ``since`` (``time.monotonic()``), or of all."""
        with self._lock:
            values = [u for t, u in self.util if since is None or t >= since]
        return sum(values) / len(values) if values else None

    def memory_fraction(self) -> float | None:
        return self.memory_used / self.memory_total if self.memory_total else None

    def __enter__(self) -> NVMLSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
