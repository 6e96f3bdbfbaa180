"""How the threads of the training process wait for the GPU while DALI's pipelines decode on it: blocked, not
spinning.

CUDA's default (``CU_CTX_SCHED_AUTO``, with fewer contexts than CPUs) makes a thread that waits for the GPU spin on
its CPU. nvImageCodec's JPEG-engine decoder waits, before each batch, for its previous batch's work on the GPU
(``cudaEventSynchronize``), which sits behind the training step's kernels: beside ResNet-50 on the H200 DALI's
executor threads spun 1.7-2.0 cores that way (1.2-1.4 of the 5 CPUs the process had with its workers held to 4),
against 0.1 with nvJPEG's CUDA decoder. While a :class:`~.dali_windows.DaliWindows` decodes on a GPU, that GPU's
context is set to ``CU_CTX_SCHED_BLOCKING_SYNC`` (the thread sleeps until the GPU signals) through the driver's
``cuCtxSetFlags`` (CUDA 12.1 and newer), and its flags are put back when the last one closes. Where the driver lacks
the call, nothing changes. Framework-free.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

import torch

__all__ = ["context_waits", "hold_blocking_waits", "release_blocking_waits"]

log = logging.getLogger(__name__)

_SCHED_MASK = 0x7
_NAMES = {0: "auto", 1: "spin", 2: "yield", 4: "blocking"}
_BLOCKING = 4
_lock = threading.Lock()
_held: dict[int, list[int]] = {}  # device index -> [holders, the context's flags before]
_loaded: list[Any] = []  # the driver library, once looked up (None where there is none)


def _driver() -> Any:
    """The CUDA driver library with ``cuCtxSetFlags``, or ``None``."""
    if not _loaded:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuCtxSetFlags  # noqa: B018  (CUDA 12.1 and newer)
        except (OSError, AttributeError):
            lib = None
        _loaded.append(lib)
    return _loaded[0]


def _on_context(index: int, call: Any) -> Any:
    """``call(lib)`` with GPU ``index``'s primary context current in this thread (retained and released around it);
    ``None`` where the driver or a call fails."""
    lib = _driver()
    if lib is None:
        return None
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if lib.cuDeviceGet(ctypes.byref(dev), index) or lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev):
        return None
    try:
        if lib.cuCtxPushCurrent_v2(ctx):
            return None
        try:
            return call(lib)
        finally:
            lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(dev)


def _flags(lib: Any) -> int | None:
    flags = ctypes.c_uint()
    return None if lib.cuCtxGetFlags(ctypes.byref(flags)) else flags.value


def _index(device: torch.device | str) -> int | None:
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def context_waits(device: torch.device | str) -> str | None:
    """How threads wait for GPU ``device`` (``"auto"``, ``"spin"``, ``"yield"``, ``"blocking"``), ``None`` off a
    GPU or where the driver does not say."""
    index = _index(device)
    flags = None if index is None else _on_context(index, _flags)
    return None if flags is None else _NAMES.get(flags & _SCHED_MASK, str(flags & _SCHED_MASK))


def hold_blocking_waits(device: torch.device | str) -> bool:
    """Set GPU ``device``'s context to blocking waits (one more holder); whether it is held (``False``: not a GPU,
    or the driver cannot; nothing to release then)."""
    index = _index(device)
    if index is None:
        return False
    with _lock:
        if index in _held:
            _held[index][0] += 1
            return True

        def block(lib: Any) -> int | None:
            before = _flags(lib)
            if before is None or lib.cuCtxSetFlags((before & ~_SCHED_MASK) | _BLOCKING):
                return None
            return before

        before = _on_context(index, block)
        if before is None:
            log.debug("the CUDA driver could not set blocking waits on cuda:%d", index)
            return False
        _held[index] = [1, before]
        return True


def release_blocking_waits(device: torch.device | str) -> None:
    """One holder of :func:`hold_blocking_waits` less; the last puts the context's flags back."""
    index = _index(device)
    with _lock:
        if index is None or index not in _held:
            return
        _held[index][0] -= 1
        if _held[index][0] > 0:
            return
        before = _held.pop(index)[1]
        _on_context(index, lambda lib: lib.cuCtxSetFlags(before))
