"""Lightning's DataLoader worker seeding (``seed_everything(workers=True)``) as a function to hand to the framework-free
cores, which never import Lightning."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

__all__ = ["lightning_worker_seed"]


def lightning_worker_seed(rank: int) -> Callable[[int], None] | None:
    """The ``worker_init_fn`` Lightning installs for rank ``rank`` when workers are seeded, else ``None``."""
    if not int(os.environ.get("PL_SEED_WORKERS", 0)):
        return None
    from lightning.fabric.utilities.seed import pl_worker_init_function

    return functools.partial(pl_worker_init_function, rank=rank)
