"""The Lightning adapter of the data path (:mod:`~lightning_gpu_boost.core.data_path`): one :class:`DataPath` per
Trainer, and the one override of the strategy's public ``process_dataloader`` hook that runs it.

Lightning calls ``process_dataloader`` for every train, val, test and predict loader after it injected its
``DistributedSampler`` and before the loader is iterated; the stage it processes is the Trainer's running stage
(``trainer.state.stage``, public: Lightning sets it before it builds that stage's loaders). Parts add their stage
functions with :func:`add_stage` in ``setup`` and take them away with :func:`remove_stage` in ``teardown``; the
order they run in is the path's declared order, whichever part was set up first.
"""

from __future__ import annotations

from typing import Any

from lightning_gpu_boost.core.data_path import DataPath, LoaderFacts, StageFn

__all__ = ["RESUME_CHECK", "add_stage", "check_resumed_places", "data_path", "facts_of", "processing_stage",
           "remove_stage"]

_PATH = "_gpu_boost_data_path"
#: the name of the stage function :func:`check_resumed_places` adds (once per Trainer, whichever parts ask)
RESUME_CHECK = "resume-check"
_SAVED = "_gpu_boost_saved_process_dataloader"


def data_path(trainer: Any) -> DataPath:
    """``trainer``'s data path (made on first use; it lives in the Trainer and goes with it)."""
    path = vars(trainer).get(_PATH)
    if path is None:
        from lightning_gpu_boost.core.run_record import run_record

        path = DataPath(choices=run_record(trainer))  # the run's record of choices: one per Trainer
        setattr(trainer, _PATH, path)
    return path


def facts_of(trainer: Any, loader: Any) -> LoaderFacts | None:
    """What ``trainer``'s data path knows of ``loader``, or ``None`` (no Trainer, or nothing recorded)."""
    path = vars(trainer).get(_PATH) if trainer is not None else None
    return path.known(loader) if path is not None else None


def processing_stage(strategy: Any) -> str | None:
    """The stage Lightning is processing a loader for ("train", "val", "test", "predict"; the sanity check's loaders
    are "val"), or None."""
    try:
        trainer = strategy.lightning_module.trainer
    except (AttributeError, RuntimeError):  # no module, or a module not attached to a Trainer
        return None
    stage = getattr(getattr(trainer, "state", None), "stage", None)
    return getattr(stage, "dataloader_prefix", None)


def add_stage(trainer: Any, stage: str, name: str, fn: StageFn) -> None:
    """Run ``fn(loader, stage)`` at the path's ``stage`` on every loader ``trainer`` processes."""
    path = data_path(trainer)
    path.add(stage, name, fn)
    strategy = trainer.strategy
    if _SAVED in vars(strategy):
        return
    setattr(strategy, _SAVED, vars(strategy).get("process_dataloader"))
    original = strategy.process_dataloader

    def process_dataloader(dataloader: object) -> object:
        return path.process(dataloader, processing_stage(strategy), original)

    strategy.process_dataloader = process_dataloader


def remove_stage(trainer: Any, name: str) -> None:
    """Undo :func:`add_stage`; the last removal gives the strategy its own ``process_dataloader`` back."""
    path = vars(trainer).get(_PATH)
    if path is None:
        return
    path.remove(name)
    strategy = trainer.strategy
    if path or _SAVED not in vars(strategy):
        return
    saved = vars(strategy).pop(_SAVED)
    if saved is None:
        vars(strategy).pop("process_dataloader", None)
    else:
        strategy.process_dataloader = saved


def check_resumed_places(trainer: Any, checkpoint: dict[str, Any]) -> None:
    """On a resume from ``checkpoint``: each train loader that keeps its own place (torchdata's
    ``StatefulDataLoader``) is checked against the place Lightning saved for it, at the ``worker_count`` stage (after
    a worker tuner's choice), and refused in one line where the worker count differs. Added once per Trainer under
    :data:`RESUME_CHECK`, whichever parts ask; the parts take it away in their ``teardown``."""
    from lightning_gpu_boost._lightning import saved_loader_states
    from lightning_gpu_boost.core.resume import refuse_other_worker_count

    states = saved_loader_states(checkpoint)
    if not states:
        return

    def check(loader: Any, stage: str | None) -> Any:
        if stage == "train" and states:
            refuse_other_worker_count(loader, states.pop(0))
        return loader

    add_stage(trainer, "worker_count", RESUME_CHECK, check)
