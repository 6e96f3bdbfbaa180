"""Optional dependencies: availability flags and import helpers that name the extra to install.

Nothing here imports an optional package at module import time; each helper imports on first use.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

#: optional module -> (pip extra, what it is for)
_EXTRAS: dict[str, tuple[str, str]] = {
    "pynvml": ("nvml", "GPU utilization sampling"),
    "lmdb": ("lmdb", "LMDB datasets"),
    "msgpack": ("lmdb", "LMDB sample encoding"),
    "nvidia.dali": (
        "dali",
        "GPU decoding with NVIDIA DALI (use the extra `dali-cuda13` with a CUDA 13 torch)",
    ),
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
        raise ImportError(
            f"`{name}` is needed for {purpose} but is not installed. Install it with: {hint}"
        ) from err
