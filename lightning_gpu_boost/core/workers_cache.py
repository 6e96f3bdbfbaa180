"""The disk cache of worker-count probes: keyed by what makes a loader's speed (dataset and its settings, collate,
batch size, the CPU set, processes per node), so the next run skips the probe."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.workers import WorkerProbe, max_workers_for_node, tune_num_workers

log = logging.getLogger(__name__)

def default_cache_path() -> Path:
    """``$XDG_CACHE_HOME/lightning_gpu_boost/num_workers.json`` (``~/.cache/...`` by default)."""
    return (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "lightning_gpu_boost"
        / "num_workers.json"
    )

__all__ = ['agreed_probe', 'default_cache_path', 'loader_fingerprint', 'read_cache', 'write_cache']

# ------------------------------------------------------------------------------------------------ the cache


def _describe(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        if len(value) > 64:
            return [len(value), _describe(value[0]), _describe(value[-1])]
        return [_describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in list(value.items())[:64]}
    own = getattr(value, "fingerprint", None)
    if callable(own) and not isinstance(value, type):  # what the object says its workers' cost depends on
        return own()
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    return type(value).__qualname__


def loader_fingerprint(loader: DataLoader, procs_per_node: int) -> str:
    """Key of a probe result: dataset class and settings, transform, collate, batch size, CPU set, processes."""
    dataset = loader.dataset
    parts = {
        "dataset": f"{type(dataset).__module__}.{type(dataset).__qualname__}",
        "dataset_vars": _describe({k: v for k, v in vars(dataset).items() if not k.startswith("_")}),
        "len": len(dataset) if hasattr(dataset, "__len__") else None,
        "collate": _describe(loader.collate_fn),
        "batch_size": loader.batch_size,
        "pin_memory": loader.pin_memory,
        "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "procs_per_node": procs_per_node,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


def read_cache(path: str | os.PathLike, key: str) -> WorkerProbe | None:
    try:
        entry = json.loads(Path(path).read_text()).get(key)
    except (OSError, ValueError):
        return None
    if entry is None:
        return None
    probe = WorkerProbe.from_dict(entry)
    probe.cached = True
    return probe


def write_cache(path: str | os.PathLike, key: str, probe: WorkerProbe) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[key] = {**probe.as_dict(), "cached": False}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except (OSError, ValueError) as err:
        log.warning("Could not write the num_workers cache %s: %s", path, err)


def agreed_probe(
    loader: Any,
    procs_per_node: int = 1,
    budget_s: float = 30.0,
    use_cache: bool = True,
    cache_path: str | os.PathLike | None = None,
    max_workers: int | None = None,
    tolerance: float = 0.03,
    broadcast: Callable[[Any, int], Any] | None = None,
    rank: int = 0,
) -> WorkerProbe:
    """Tune ``loader`` once for the whole job: from the cache when rank 0 has a hit, else every rank probes its
    own shard at the same time (as they will load in training) and rank 0's result goes to all. ``broadcast(obj,
    src)``: the job's communication (``None`` for one process; Lightning's ``strategy.broadcast`` under DDP)."""
    key = loader_fingerprint(loader, procs_per_node)
    path = cache_path or default_cache_path()
    limit = max_workers if max_workers is not None else max_workers_for_node(procs_per_node)
    probe = read_cache(path, key) if use_cache else None
    if probe is not None and probe.max_workers != limit:
        # searched up to another bound (doctor, or a tuner with its own max_workers): its choice may lie outside
        # this caller's range, or leave part of it unsearched; searched again, and the cache keeps the newest
        probe = None
    need_probe = probe is None if broadcast is None else broadcast(probe is None, 0)
    if need_probe:
        probe = tune_num_workers(loader, budget_s=budget_s, max_workers=limit, tolerance=tolerance)
        if use_cache and rank == 0:
            write_cache(path, key, probe)
    if broadcast is not None:
        probe = WorkerProbe.from_dict(broadcast(probe.as_dict() if probe else None, 0))
    return probe  # type: ignore[return-value]
