"""What the framework-free cores get from the Lightning job as plain functions (they never import Lightning): the
DataLoader worker seeding (``seed_everything(workers=True)``) and the job's broadcast."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

__all__ = ["job_broadcast", "lightning_worker_seed"]


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
