"""What the framework-free cores get from the Lightning job as plain functions (they never import Lightning): the
DataLoader worker seeding (``seed_everything(workers=True)``), the job's broadcast, and the worker probe agreed by
the job's processes (the one route every worker count is measured by: ``AutoNumWorkers`` and
``num_workers="auto"``)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

__all__ = ["job_broadcast", "job_probe", "lightning_worker_seed"]


def lightning_worker_seed(rank: int) -> Callable[[int], None] | None:
    """The ``worker_init_fn`` Lightning installs for rank ``rank`` when workers are seeded, else ``None``."""
    if not int(os.environ.get("PL_SEED_WORKERS", 0)):
        return None
    from lightning.fabric.utilities.seed import pl_worker_init_function

    return functools.partial(pl_worker_init_function, rank=rank)


def job_broadcast(trainer: Any) -> Callable[[Any, int], Any] | None:
    """``broadcast(obj, src)`` over the Trainer's processes, or ``None`` for a job of one process (or no Trainer)."""
    if trainer is None or trainer.world_size <= 1:
        return None
    return lambda obj, src: trainer.strategy.broadcast(obj, src=src)


def job_probe(trainer: Any, loader: Any, budget_s: float = 30.0, use_cache: bool = True, cache_path: Any = None,
              max_workers: int | None = None, tolerance: float = 0.03) -> Any:  # fmt: skip
    """:func:`~lightning_gpu_boost.core.workers_cache.agreed_probe` with the Trainer's processes per node, rank and
    communication (``trainer`` may be ``None``: one process)."""
    from lightning_gpu_boost.core.cpus import processes_per_node
    from lightning_gpu_boost.core.workers_cache import agreed_probe

    return agreed_probe(
        loader, processes_per_node(trainer) if trainer is not None else 1, budget_s, use_cache, cache_path,
        max_workers, tolerance, broadcast=job_broadcast(trainer), rank=trainer.global_rank if trainer is not None else 0,
    )  # fmt: skip
