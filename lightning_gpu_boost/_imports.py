"""Optional dependencies: availability flags and import helpers that name the extra to install.

Nothing here imports an optional package at module import time; each helper imports on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ['module_available', 'require']

#: optional module -> (pip extra, what it is for)
_EXTRAS: dict[str, tuple[str, str]] = {
    "pynvml": ("nvml", "GPU utilization sampling"),
    "lmdb": ("lmdb", "LMDB datasets"),
    "msgpack": ("lmdb", "LMDB sample encoding"),
    "nvidia.dali": ("dali", "decoding with NVIDIA DALI"),
    "nvidia.nvimgcodec": ("gpu-decode", "decoding on the GPU's JPEG engines (nvImageCodec)"),
    "litdata": ("stream", "streaming data from object storage (litdata)"),
    "boto3": ("stream", "checking an S3 stream before training"),
    "botocore": ("stream", "checking an S3 stream before training"),
    "matplotlib": ("plot", "plots"),
    "matplotlib.figure": ("plot", "plots"),
    "torchvision": ("", "torchvision models and transforms"),
}


def module_available(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def require(name: str) -> ModuleType:
    """Import the optional module ``name`` or raise an ``ImportError`` naming the extra that provides it."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        extra, purpose = _EXTRAS.get(name, ("", name))
        hint = f"pip install 'lightning-gpu-boost[{extra}]'" if extra else f"pip install {name}"
        if extra in _CUDA13_TWINS:
            hint = _cuda_hint(extra)
        raise ImportError(
            f"`{name}` is needed for {purpose} but is not installed. Install it with: {hint}"
        ) from err


#: extras built per CUDA major version: ``<extra>`` for CUDA 12, ``<extra>-cuda13`` for CUDA 13
_CUDA13_TWINS = ("dali", "gpu-decode")


def _cuda_hint(extra: str) -> str:
    """The extra's wheels are built per CUDA major version: name the one that matches this torch."""
    import sys

    torch = sys.modules.get("torch")
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    cu13 = f"pip install 'lightning-gpu-boost[{extra}-cuda13]'"
    cu12 = f"pip install 'lightning-gpu-boost[{extra}]'"
    if cuda and cuda.startswith("13"):
        return f"{cu13} (this torch is built for CUDA {cuda}; CUDA 12 builds use the extra `{extra}`)"
    mine = f" (this torch is built for CUDA {cuda})" if cuda else ""
    return f"{cu12} for CUDA 12 torch builds{mine}, or {cu13} for CUDA 13 builds"
