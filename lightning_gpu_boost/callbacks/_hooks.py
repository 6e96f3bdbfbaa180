"""One place where our callbacks plug into Lightning's loader processing: ``Strategy.process_dataloader``.

Lightning calls the strategy's public ``process_dataloader`` hook for every train, val, test and predict loader,
after it injected its ``DistributedSampler`` and before the loader is iterated. Several of our features hook in
there (AutoNumWorkers before the strategy's own processing, StreamPrefetch after it); a small registry on the
strategy instance keeps their order fixed and their removal independent of the order of teardown.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

__all__ = ['DataLoaderHook', 'add_dataloader_hook', 'processing_stage', 'remove_dataloader_hook']

_REGISTRY = "_gpu_boost_dataloader_hooks"
_SAVED = "_gpu_boost_saved_process_dataloader"

#: ``hook(dataloader, stage) -> dataloader``; ``stage`` is "train", "val", "test", "predict" or None if unknown
DataLoaderHook = Callable[[Any, "str | None"], Any]


def processing_stage() -> str | None:
    """The stage Lightning is processing a loader for ("train", "val", "test", "predict"), or None.

    Read from the ``stage`` argument of Lightning's ``_process_dataloader`` on the call stack (it calls the
    strategy hook). This is the one private detail we rely on; ``tests/callbacks/test_hooks.py`` fails loudly if
    Lightning changes it.
    """
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return None
        if frame.f_code.co_name == "_process_dataloader" and "stage" in frame.f_locals:
            return getattr(frame.f_locals["stage"], "dataloader_prefix", None)
        frame = frame.f_back
    return None


def add_dataloader_hook(strategy: Any, name: str, hook: DataLoaderHook, before: bool) -> None:
    """Run ``hook`` on every loader the strategy processes: ``before`` or after its own ``process_dataloader``."""
    hooks: dict[str, tuple[bool, DataLoaderHook]] | None = vars(strategy).get(_REGISTRY)
    if hooks is None:
        hooks = {}
        setattr(strategy, _SAVED, vars(strategy).get("process_dataloader"))
        original = strategy.process_dataloader

        def process_dataloader(dataloader: object) -> object:
            stage = processing_stage()
            for is_before, fn in list(hooks.values()):
                if is_before:
                    dataloader = fn(dataloader, stage)
            dataloader = original(dataloader)
            for is_before, fn in list(hooks.values()):
                if not is_before:
                    dataloader = fn(dataloader, stage)
            return dataloader

        setattr(strategy, _REGISTRY, hooks)
        strategy.process_dataloader = process_dataloader
    hooks[name] = (before, hook)


def remove_dataloader_hook(strategy: Any, name: str) -> None:
    """Undo :func:`add_dataloader_hook`; the last removal restores the strategy's own ``process_dataloader``."""
    hooks = vars(strategy).get(_REGISTRY)
    if not hooks or name not in hooks:
        return
    del hooks[name]
    if not hooks:
        saved = vars(strategy).pop(_SAVED, None)
        del strategy.__dict__[_REGISTRY]
        if saved is None:
            del strategy.process_dataloader
        else:
            strategy.process_dataloader = saved
