"""Messages logged once per node: what each node decided for its own CPUs (worker counts, DALI threads)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ['lightning_level', 'node_info']

#: the logger of Lightning's ``rank_zero_info`` (Lightning shows its INFO messages), without its rank-zero guard
_log = logging.getLogger("lightning.pytorch.utilities.rank_zero")


def node_info(trainer: Any, message: str) -> bool:
    """Log ``message`` on the first process of each node (``local_rank == 0``; a lone process when ``trainer`` is
    ``None``), prefixed with the node's rank on a job of several nodes. Returns whether this process logged it."""
    if trainer is not None and getattr(trainer, "local_rank", 0) != 0:
        return False
    nodes = getattr(trainer, "num_nodes", 1) if trainer is not None else 1
    prefix = f"[node {trainer.node_rank}] " if trainer is not None and isinstance(nodes, int) and nodes > 1 else ""
    _log.info(prefix + message)
    return True


@contextmanager
def lightning_level(level: int) -> Iterator[None]:
    """Lightning's own messages at ``level`` inside the block (the CLI's tables print without its INFO lines), and
    as they were after it: a command run in-process (a test, a notebook) leaves the process's logging unchanged."""
    logger = logging.getLogger("lightning.pytorch")
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)
