"""One place where our callbacks plug into Lightning's loader processing: ``Strategy.process_dataloader``.

Lightning calls the strategy's public ``process_dataloader`` hook for every train, val, test and predict loader,
after it injected its ``DistributedSampler`` and before the loader is iterated. Several of our features hook in
there (AutoNumWorkers before the strategy's own processing, StreamPrefetch after it); a small registry on the
strategy instance keeps their order fixed and their removal independent of the order of teardown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ['DataLoaderHook', 'add_dataloader_hook', 'processing_stage', 'remove_dataloader_hook']

_REGISTRY = "_gpu_boost_dataloader_hooks"
_SAVED = "_gpu_boost_saved_process_dataloader"

#: ``hook(dataloader, stage) -> dataloader``; ``stage`` is "train", "val", "test", "predict" or None if unknown
DataLoaderHook = Callable[[Any, "str | None"], Any]


def processing_stage(strategy: Any) -> str | None:
    """The stage Lightning is processing a loader for ("train", "val", "test", "predict"), or None: the Trainer's
    running stage (``trainer.state.stage``, public), which Lightning sets before it builds that stage's loaders (the
    sanity check's loaders are "val")."""
    try:
        trainer = strategy.lightning_module.trainer
    except (AttributeError, RuntimeError):  # no module, or a module not attached to a Trainer
        return None
    stage = getattr(getattr(trainer, "state", None), "stage", None)
    return getattr(stage, "dataloader_prefix", None)


def add_dataloader_hook(strategy: Any, name: str, hook: DataLoaderHook, before: bool) -> None:
    """Run ``hook`` on every loader the strategy processes: ``before`` or after its own ``process_dataloader``."""
    hooks: dict[str, tuple[bool, DataLoaderHook]] | None = vars(strategy).get(_REGISTRY)
    if hooks is None:
        hooks = {}
        setattr(strategy, _SAVED, vars(strategy).get("process_dataloader"))
        original = strategy.process_dataloader

        def process_dataloader(dataloader: object) -> object:
            stage = processing_stage(strategy)
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
