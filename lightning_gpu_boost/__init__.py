"""lightning-gpu-boost: keep the GPU busy in PyTorch Lightning.

Importing the package registers the ``ddp_boost`` strategies with Lightning; the public names below load their
modules on first access, and optional dependencies (DALI, lmdb, NVML, matplotlib) are imported only where used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "StreamPrefetch": "lightning_gpu_boost.callbacks.stream_prefetch",
    "AutoNumWorkers": "lightning_gpu_boost.callbacks.auto_num_workers",
    "GPUUtilWatchdog": "lightning_gpu_boost.callbacks.gpu_util_watchdog",
    "GPUBoost": "lightning_gpu_boost.callbacks.gpu_boost",
    "BadSampleReport": "lightning_gpu_boost.callbacks.bad_samples",
    "SpanEpochs": "lightning_gpu_boost.callbacks.spanning",
    "SpanningLoader": "lightning_gpu_boost.core.spanning",
    "DDPBoostStrategy": "lightning_gpu_boost.strategies.presets",
    "recommended_precision": "lightning_gpu_boost.strategies.presets",
    "configure_backends": "lightning_gpu_boost.strategies.presets",
    "tune_num_workers": "lightning_gpu_boost.core.workers",
    "StreamPrefetcher": "lightning_gpu_boost.core.prefetch",
    "GPUNormalize": "lightning_gpu_boost.core.prefetch",
    "BoostDataModule": "lightning_gpu_boost.datamodules.base",
    "ImageFolderDataModule": "lightning_gpu_boost.datamodules.image_folder",
    "ImageFolderDataset": "lightning_gpu_boost.datamodules.image_folder",
    "LMDBDataModule": "lightning_gpu_boost.datamodules.lmdb",
    "DALIDataModule": "lightning_gpu_boost.datamodules.dali",
    "DALILoader": "lightning_gpu_boost.core.dali",
    "pack_image_folder": "lightning_gpu_boost.core.lmdb",
    "pack_dataset": "lightning_gpu_boost.core.lmdb",
    "make_jpeg_folder": "lightning_gpu_boost.core.images",
    "usable_cpus": "lightning_gpu_boost.core.cpus",
    "default_num_workers": "lightning_gpu_boost.core.cpus",
}

__all__ = ["__version__", *_EXPORTS]

from lightning_gpu_boost._registration import install as _install  # noqa: E402

_install()  # registers "ddp_boost" with Lightning once Lightning's strategies are imported


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lightning_gpu_boost' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
