"""Whether a run's batches keep one shape: cuDNN autotuning (``torch.backends.cudnn.benchmark``) pays off only
where they do. With shapes that change from batch to batch (padded audio or text, multi-scale images) every new
shape is tuned again, inside the step, and the run is slower than without autotuning.

Nothing here needs a Trainer or CUDA.
"""

from __future__ import annotations

from typing import Any

#: distinct batch shapes beyond which autotuning is judged a loss: one for full batches and one for an epoch's
#: last, short batch are normal; a validation or test loader's shapes are not counted
VARIABLE_SHAPES = 4


def shape_signature(batch: Any) -> tuple:
    """The shapes of every tensor in ``batch`` (tensors, lists, tuples and dicts nested), in order."""
    shape = getattr(batch, "shape", None)
    if shape is not None and hasattr(batch, "dtype"):
        return (tuple(shape),)
    if isinstance(batch, dict):
        return tuple(s for key in batch for s in shape_signature(batch[key]))
    if isinstance(batch, (list, tuple)):
        return tuple(s for item in batch for s in shape_signature(item))
    return ()


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
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit must be an int >= 1, got {limit!r}.")
        self.limit = limit
        self.shapes: set[tuple] = set()
        self.batches = 0

    def see(self, batch: Any) -> bool:
        """Record ``batch``'s shapes; ``True`` once (when the distinct shapes first exceed ``limit``)."""
        self.batches += 1
        before = len(self.shapes)
        self.shapes.add(shape_signature(batch))
        return before == self.limit and len(self.shapes) > self.limit

    @property
    def variable(self) -> bool:
        return len(self.shapes) > self.limit
