"""Whether a run's batches keep one shape: cuDNN autotuning (``torch.backends.cudnn.benchmark``) pays off only
where they do. With shapes that change from batch to batch (padded audio or text, multi-scale images) every new
shape is tuned again, inside the step, and the run is slower than without autotuning.

Nothing here needs a Trainer or CUDA.
"""

from __future__ import annotations

from typing import Any

from lightning_gpu_boost import _checks as checks

__all__ = ['ShapeWatch', 'VARIABLE_SHAPES', 'shape_signature', 'tensors_in']

#: distinct batch shapes beyond which autotuning is judged a loss: one for full batches and one for an epoch's
#: last, short batch are normal; a validation or test loader's shapes are not counted
VARIABLE_SHAPES = 4


def tensors_in(batch: Any) -> list[Any]:
    """Every tensor in ``batch`` (tensors, lists, tuples and dicts nested), in order."""
    if hasattr(batch, "shape") and hasattr(batch, "dtype"):
        return [batch]
    if isinstance(batch, dict):
        return [t for v in batch.values() for t in tensors_in(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in tensors_in(v)]
    return []


def shape_signature(batch: Any) -> tuple:
    """The shapes of every tensor in ``batch``, in order."""
    return tuple(tuple(t.shape) for t in tensors_in(batch))


class ShapeWatch:
    """Counts the distinct shapes of the batches it is shown.

    Args:
        limit: distinct shapes that still count as fixed, ``>= 1``.

    Example::

        >>> import torch
        >>> watch = ShapeWatch(limit=2)
        >>> [watch.see(torch.zeros(4, n)) for n in (3, 3, 5, 7)]
        [False, False, False, True]
    """

    def __init__(self, limit: int = VARIABLE_SHAPES) -> None:
        checks.check_int("limit", limit, low=1)
        self.limit = limit
        self.shapes: set[tuple] = set()

    def see(self, batch: Any) -> bool:
        """Record ``batch``'s shapes; ``True`` once (when the distinct shapes first exceed ``limit``)."""
        before = len(self.shapes)
        self.shapes.add(shape_signature(batch))
        return before == self.limit and len(self.shapes) > self.limit

    @property
    def variable(self) -> bool:
        return len(self.shapes) > self.limit
