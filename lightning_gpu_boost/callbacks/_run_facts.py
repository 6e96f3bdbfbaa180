"""The run's facts as GPUBoost's parts state them: the choices in the run record
(:mod:`~lightning_gpu_boost.core.run_record`: a worker tuner's ``num_workers``), and what the loaders and tuners of a
fit state about themselves, read from the Trainer by their attributes, never by class names.

What each part states:
- a worker tuner (``AutoNumWorkers``, and ``GPUBoost`` through its ``parts``): ``tunes_num_workers = True`` and
  ``probes`` (stage -> :class:`~lightning_gpu_boost.core.workers.WorkerProbe`); a DataModule with
  ``num_workers="auto"``: ``auto_probes``;
- a DataLoader of the package's DataModules: how its uint8 images normalize, in the data path's record
  (:mod:`~lightning_gpu_boost.core.data_path`), and its dataset ``uint8_images = True``;
- a loader that decodes with DALI (``DALILoader``): ``dali = True``;
- ``StreamPrefetch``: the ``StreamPrefetcher`` it wraps each loader in; ``SpanEpochs``: the ``SpanningLoader``.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl

from lightning_gpu_boost.callbacks._data_path import facts_of
from lightning_gpu_boost.core.cpus import processes_per_node, usable_cpus
from lightning_gpu_boost.core.loaders import loader_entries
from lightning_gpu_boost.core.prefetch import StreamPrefetcher
from lightning_gpu_boost.core.run_record import run_record
from lightning_gpu_boost.core.verdicts import RunFacts, fetches_batches

__all__ = ["loader_facts", "run_facts", "worker_probe"]


def _parts(trainer: pl.Trainer) -> list[Any]:
    """Every callback of the Trainer and the parts of those made of parts (``GPUBoost``)."""
    return [p for c in trainer.callbacks for p in (c, *getattr(c, "parts", {}).values())]


def loader_facts(trainer: pl.Trainer) -> dict[str, Any]:
    """The training loaders as the fit runs them: whether they are prefetched, the DALI pipelines, the DataLoaders
    and which of those a ``SpanningLoader`` keeps across epochs."""
    train = getattr(trainer, "train_dataloader", None)
    items = train.values() if isinstance(train, dict) else train if isinstance(train, (list, tuple)) else [train]
    entries = list(loader_entries(train))
    return {
        "prefetch": any(isinstance(x, StreamPrefetcher) for x in items),
        "dali": [x for x in items if getattr(x, "dali", False) is True],
        "loaders": [loader for loader, _ in entries],
        "spanned": {id(loader) for loader, spanned in entries if spanned},
    }


def worker_probe(trainer: pl.Trainer) -> Any:
    """The train loader's worker probe where one ran in this fit (a tuner's, or a DataModule's
    ``num_workers="auto"``), else None."""
    found = [p.probes["train"] for p in _parts(trainer) if "train" in (getattr(p, "probes", None) or {})]
    probes = getattr(getattr(trainer, "datamodule", None), "auto_probes", None) or {}
    if "train" in probes:
        found.append(probes["train"])
    return found[0] if found else None


def run_facts(trainer: pl.Trainer, batch_kind: str | None = None, found: dict[str, Any] | None = None) -> RunFacts:
    """The run's configuration as the advice needs it (``found``: :func:`loader_facts` where the caller has it)."""
    found = found or loader_facts(trainer)
    loader = found["loaders"][0] if found["loaders"] else None
    procs = processes_per_node(trainer)
    probe = worker_probe(trainer)
    dm = getattr(trainer, "datamodule", None)
    chosen = run_record(trainer).chosen_by()
    tuner = (probe is not None or "num_workers" in chosen or any(getattr(p, "tunes_num_workers", False) for p in
             _parts(trainer)) or getattr(dm, "num_workers", None) == "auto")  # fmt: skip
    val = [(v.num_workers, bool(v.persistent_workers) or spanned)
           for v, spanned in loader_entries(getattr(trainer, "val_dataloaders", None))]  # fmt: skip
    batches = trainer.num_training_batches
    spanned = loader is not None and id(loader) in found.get("spanned", ())
    facts = facts_of(trainer, loader) if loader is not None else None
    uint8 = loader is not None and (getattr(loader.dataset, "uint8_images", False) is True
                                    or (facts is not None and facts.normalize is not None))  # fmt: skip
    from lightning_gpu_boost.core.gpu_decode import recognize
    from lightning_gpu_boost.core.streaming.source import remote_stream

    return RunFacts(
        remote_stream=None if loader is None else remote_stream(loader.dataset),
        cuda=trainer.strategy.root_device.type == "cuda",
        num_workers=None if loader is None else loader.num_workers,
        usable_cpus=max(1, usable_cpus() // procs),
        batch_size=None if loader is None else loader.batch_size,
        pin_memory=None if loader is None else loader.pin_memory,
        persistent_workers=None if loader is None else loader.persistent_workers or spanned,
        prefetch=found["prefetch"], dali=bool(found["dali"]), uint8_images=uint8,
        tuner=tuner, probe=probe, val_loaders=val, batch_kind=batch_kind,
        batched_fetch=loader is not None and fetches_batches(loader), spans_epochs=spanned, chosen_by=chosen,
        decode=facts.decode if facts is not None else None,
        decode_measuring=facts is not None and facts.decode_measuring,
        decode_takes=loader is not None and recognize(getattr(loader, "dataset", None)) is not None,
        batches_per_epoch=int(batches) if isinstance(batches, int) or (isinstance(batches, float) and math.isfinite(batches)) else None,
    )  # fmt: skip
