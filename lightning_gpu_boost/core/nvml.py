"""NVML sampling of this process's GPU in a background thread (no-op where NVML or a GPU is missing)."""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)


def nvml_index(cuda_index: int) -> int | str:
    """NVML device (index or UUID) of CUDA device ``cuda_index``, honouring ``CUDA_VISIBLE_DEVICES``."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible or cuda_index >= len(visible):
        return cuda_index
    entry = visible[cuda_index]
    return int(entry) if entry.isdigit() else entry


class NVMLSampler:
    """Samples GPU utilization (%) and memory use of one GPU every ``interval`` seconds in a daemon thread.

    Where NVML is not installed, not permitted, or no GPU exists, :attr:`available` is ``False`` and the sampler
    records nothing (one info line). It never raises into training.

    Example::

        >>> with NVMLSampler(cuda_index=0, interval=0.05) as sampler:
        ...     pass
        >>> sampler.mean_util() is None or 0 <= sampler.mean_util() <= 100
        True
    """

    def __init__(self, cuda_index: int = 0, interval: float = 0.1) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}.")
        self.cuda_index = cuda_index
        self.interval = interval
        self.util: list[float] = []
        self.memory_used: list[int] = []
        self.available = False
        self._handle = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _open(self) -> bool:
        try:
            import pynvml

            pynvml.nvmlInit()
            target = nvml_index(self.cuda_index)
            if isinstance(target, int):
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(target)
            else:
                self._handle = pynvml.nvmlDeviceGetHandleByUUID(target)
            pynvml.nvmlDeviceGetUtilizationRates(self._handle)
            return True
        except Exception as err:  # ImportError, NVMLError (no driver, no permission, MIG)
            log.info("GPU utilization is not sampled (%s); timings only.", err)
            return False

    def _run(self) -> None:
        import pynvml

        while not self._stop.wait(self.interval):
            try:
                self.util.append(float(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
                self.memory_used.append(int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).used))
            except Exception:  # never let sampling break training
                return

    def start(self) -> NVMLSampler:
        if self._thread is None:
            self.available = self._open()
            if self.available:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
                self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None

    def reset(self) -> None:
        """Forget the samples taken so far (e.g. after warm-up)."""
        self.util.clear()
        self.memory_used.clear()

    def mean_util(self) -> float | None:
        return sum(self.util) / len(self.util) if self.util else None

    def __enter__(self) -> NVMLSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
