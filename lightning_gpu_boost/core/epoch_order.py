"""Each epoch's index order as a function of one seed and the epoch: what makes a user's own sampler resumable.

A resumed run must hand the step exactly the batches the uninterrupted run would have. For a ``SequentialSampler``
or a ``DistributedSampler`` (whose order is a function of ``set_epoch``) skipping the batches already done is
enough. A ``RandomSampler`` is not: without a generator it draws each epoch's order from the process's global
random state, with one from its generator's state, and neither state is in a Lightning checkpoint.
:class:`EpochOrder` draws one seed per run (from the sampler's generator, or from the global random state, so that
``seed_everything`` still decides it), keeps it in the loader's saved state, and iterates each epoch's order with
the random states the sampler reads (the global one, and its ``generator``) set to a stream of that epoch's own,
derived from the seed; the caller's random states are put back after each draw. The resumed run, given the same
seed, draws every epoch's order exactly as the uninterrupted run did (as torchdata's ``StatefulDataLoader`` keeps
its random sampler's seed). Framework-free.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = ["EpochOrder", "epoch_seed", "inner_sampler", "start_index_sampler", "unplaceable"]

#: samplers whose order depends on nothing but their settings and ``set_epoch``: no random state to swap
_FIXED_ORDER = (SequentialSampler, DistributedSampler)
#: torch's samplers that draw only from their ``generator``, or the global random state where it is ``None``
_RANDOM = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


def inner_sampler(index_sampler: Any) -> Any:
    """The sampler under a ``BatchSampler`` (any batch sampler with a ``sampler``), else ``index_sampler``."""
    inner = getattr(index_sampler, "sampler", None)
    return index_sampler if inner is None else inner


def unplaceable(index_sampler: Any) -> str | None:
    """Why the epochs of ``index_sampler`` (a batch sampler or a sampler) cannot be replayed exactly, or ``None``.

    Replayable: torch's samplers (their random draws come from the states :class:`EpochOrder` sets) and any
    sampler or batch sampler with ``set_epoch`` (whose order is, by that contract, a function of its epoch)."""
    for obj in dict.fromkeys((index_sampler, inner_sampler(index_sampler)), None):
        if callable(getattr(obj, "set_epoch", None)) or type(obj) in (BatchSampler, *_FIXED_ORDER, *_RANDOM):
            continue
        return (f"its {type(obj).__name__} is not one of torch's samplers and has no set_epoch, so its order may "
                "come from a random state a checkpoint does not hold")  # fmt: skip
    return None


def start_index_sampler(index_sampler: Any, batch_size: int | None, epoch: int | None, batches: int) -> bool:
    """Make the next iteration of ``index_sampler`` (a ``BatchSampler`` or a sampler) begin ``batches`` batches
    into ``epoch`` where its sampler can do that by itself (``start_at(epoch, samples)``): ``True`` then, ``False``
    where the caller must skip the index batches itself (:class:`~lightning_gpu_boost.core.resume.SkipFirst`)."""
    if batches <= 0:
        return True
    if isinstance(index_sampler, BatchSampler) and batch_size:
        start_at = getattr(index_sampler.sampler, "start_at", None)
        if callable(start_at) and epoch is not None:
            start_at(epoch, batches * index_sampler.batch_size)
            return True
    return False


def epoch_seed(seed: int, epoch: int, stream: int = 0) -> int:
    """The seed of ``epoch``'s random stream number ``stream`` under the run's ``seed`` (a 64-bit mix)."""
    x = (seed + 0x9E3779B97F4A7C15 * (epoch + 1) + 0xBF58476D1CE4E5B9 * (stream + 1)) % (1 << 64)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % (1 << 64)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % (1 << 64)
    return x ^ (x >> 31)


class EpochOrder:
    """The index batches of ``index_sampler``, epoch by epoch, each epoch's order a function of :attr:`seed` and
    the epoch (see the module's docstring).

    Args:
        index_sampler: what the loader draws indices from: its batch sampler, or its sampler (``batch_size=None``).

    Example::

        >>> from torch.utils.data import BatchSampler, RandomSampler
        >>> order = EpochOrder(BatchSampler(RandomSampler(range(6)), 2, False))
        >>> first = list(order.batches(epoch=1))
        >>> again = EpochOrder(BatchSampler(RandomSampler(range(6)), 2, False), seed=order.seed)
        >>> list(again.batches(epoch=1, skip=1)) == first[1:]
        True
    """

    def __init__(self, index_sampler: Any, seed: int | None = None) -> None:
        self.index_sampler = index_sampler
        self.sampler = inner_sampler(index_sampler)
        #: the run's seed (drawn at the first epoch where not given; saved with the loader's place)
        self.seed = seed
        objects = dict.fromkeys((index_sampler, self.sampler), None)
        self._generators = list({id(g): g for o in objects if isinstance(g := getattr(o, "generator", None),
                                                                          torch.Generator)}.values())  # fmt: skip
        # the global state is swapped unless every object is known not to read it: fixed orders, a plain
        # BatchSampler, torch's random samplers with a generator of their own
        self._global = not all(isinstance(o, _FIXED_ORDER) or type(o) is BatchSampler
                               or (isinstance(o, _RANDOM) and getattr(o, "generator", None) is not None)
                               for o in objects)  # fmt: skip
        #: the random states swapped per draw: ``None`` for the global one, then each generator
        self._streams: list[torch.Generator | None] = ([None] if self._global else []) + self._generators

    def draw_seed(self) -> int:
        """The run's seed, drawn once: from the sampler's generator where it has one, else the global state."""
        if self.seed is None:
            generator = self._generators[0] if self._generators else None
            self.seed = int(torch.randint(0, 1 << 62, (), generator=generator))
        return self.seed

    def set_epoch(self, epoch: int) -> None:
        """Tell the sampler (and a batch sampler with ``set_epoch``) which epoch it draws."""
        for obj in dict.fromkeys((self.index_sampler, self.sampler), None):
            set_epoch = getattr(obj, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def batches(self, epoch: int, skip: int = 0) -> Iterator[Any]:
        """``epoch``'s index batches after its first ``skip`` ones (drawn, not loaded; a sampler with
        ``start_at(epoch, samples)`` skips by itself)."""
        seed = self.draw_seed()
        self.set_epoch(epoch)
        by_sampler = start_index_sampler(self.index_sampler, 1, epoch, skip)
        ours: list[Any] = []  # this epoch's random states: the global one first (where swapped), then each generator
        if self._global:
            ours.append(torch.Generator().manual_seed(epoch_seed(seed, epoch)).get_state())
        ours += [torch.Generator().manual_seed(epoch_seed(seed, epoch, i + 1)).get_state()
                 for i in range(len(self._generators))]  # fmt: skip
        it = iter(self.index_sampler)
        sentinel = object()
        n = 0
        while True:
            item = self._next(it, ours, sentinel)
            if item is sentinel:
                return
            n += 1
            if by_sampler or n > skip:
                yield item

    def _next(self, it: Iterator[Any], ours: list[Any], sentinel: object) -> Any:
        """``next(it, sentinel)`` with the epoch's random states in place, the caller's put back after."""
        if not ours:
            return next(it, sentinel)
        gens = self._streams
        theirs = [torch.get_rng_state() if g is None else g.get_state() for g in gens]
        for g, state in zip(gens, ours, strict=True):
            torch.set_rng_state(state) if g is None else g.set_state(state)
        try:
            return next(it, sentinel)
        finally:
            for i, (g, state) in enumerate(zip(gens, theirs, strict=True)):
                ours[i] = torch.get_rng_state() if g is None else g.get_state()
                torch.set_rng_state(state) if g is None else g.set_state(state)
