"""Lightning callbacks: thin adapters over the framework-free cores."""

from lightning_gpu_boost.callbacks.auto_num_workers import AutoNumWorkers
from lightning_gpu_boost.callbacks.bad_samples import BadSampleReport
from lightning_gpu_boost.callbacks.gpu_boost import GPUBoost
from lightning_gpu_boost.callbacks.gpu_util_watchdog import GPUUtilWatchdog
from lightning_gpu_boost.callbacks.spanning import SpanEpochs
from lightning_gpu_boost.callbacks.stream_prefetch import StreamPrefetch

__all__ = ["AutoNumWorkers", "BadSampleReport", "GPUBoost", "GPUUtilWatchdog", "SpanEpochs", "StreamPrefetch"]
