"""``SpanningLoader``: one DataLoader iterator kept across epochs, so that the workers load the next epoch's batches
while this one trains.

A DataLoader's workers start an epoch's batches only when the epoch's iterator is made: every epoch begins with the
workers (started again, or woken with ``persistent_workers=True``) filling their queue while the GPU waits. On long
epochs that is a rounding error; on epochs of a few batches, with a validation pass after each, it is most of the
run. ``SpanningLoader`` gives the workers one endless stream of batch indices, epoch after epoch (each epoch's order
drawn from the loader's own sampler, ``set_epoch`` called where it has one), and hands out one epoch's worth per
iteration. Every sample is still seen exactly once per epoch, in the order the sampler gives.

Framework-free: any training loop that iterates it once per epoch can use it; in Lightning return it from
``train_dataloader()`` / ``val_dataloader()``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost.core.resume import (
    ResumableDataLoader,
    resume_start,
    sampler_epoch,
    start_index_sampler,
)

__all__ = ['RESTART_SHARE', 'SpanningLoader', 'restart_share', 'span_decision']


class _EpochAfterEpoch:
    """The batches (lists of indices) of ``batch_sampler``, one epoch after another without end; the first
    ``limit`` of each epoch where given. The sampler under it gets ``set_epoch(epoch)`` before each epoch."""

    def __init__(self, batch_sampler: Any, sampler: Any, limit: int | None) -> None:
        self.batch_sampler, self.sampler, self.limit = batch_sampler, sampler, limit
        self.epoch: int | None = None  # the epoch the next pass draws; read from the sampler at the first
        self.first = 0  # the first epoch drawn
        self.skip = 0  # batches of the first epoch drawn already handed out before (a resumed run)

    def __iter__(self) -> Iterator[Any]:
        if self.epoch is None:
            self.epoch = self.first = int(getattr(self.sampler, "epoch", 0) or 0)
        skip, self.skip = self.skip, 0
        while True:
            set_epoch = getattr(self.sampler, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.epoch)
            n = skip
            by_sampler = start_index_sampler(self.batch_sampler, 1, self.epoch, skip)  # its sampler skips itself
            batches = iter(self.batch_sampler)
            for _ in range(0 if by_sampler else skip):  # drawn, not loaded
                next(batches, None)
            skip = 0
            for batch in batches:
                if self.limit is not None and n >= self.limit:
                    break
                n += 1
                yield batch
            if n == 0:
                return  # an empty sampler: no endless loop
            self.epoch += 1


class SpanningLoader:
    """Iterate ``loader`` epoch by epoch through one iterator whose workers never stop between epochs.

    Each ``iter()`` yields one epoch: ``len(loader)`` batches, or ``batches_per_epoch`` where given (the first ones of
    each epoch's order: a validation pass limited to a few batches then loads only those). The workers keep
    ``num_workers x prefetch_factor`` batches in flight across the epoch's end, so the next epoch's first batches
    are ready when it starts. If an epoch is left before its last batch, the next ``iter()`` first discards the
    batches the previous epoch left (already loaded or in flight), so each epoch still starts at its own first
    batch.

    Args:
        loader: a ``DataLoader`` over a map-style dataset (its sampler, batch size, workers, collate function,
            pinning and worker settings are kept; ``persistent_workers`` is moot: the one iterator keeps them).
        batches_per_epoch: batches handed out per epoch (e.g. Lightning's ``limit_val_batches``), ``>= 1``;
            ``None``: the whole epoch.

    Raises:
        ValueError: ``loader`` is not a DataLoader over a map-style dataset, or a bad ``batches_per_epoch``.

    Caveats:
        The next epoch's batches are loaded before it begins: a dataset that changes per epoch (a curriculum, an
        augmentation strength set in ``on_train_epoch_start``) must not be used with it. Lightning injects its
        ``DistributedSampler`` only into ``DataLoader`` objects: under DDP give the loader a ``DistributedSampler``
        yourself before wrapping it. Worker tuners (``AutoNumWorkers``, ``GPUBoost``'s) tune the loader you wrap
        (:attr:`source`): the workers are started from its settings at the first ``iter()``. Resumable mid-epoch
        (``state_dict`` / ``load_state_dict``, as Lightning saves them): a resumed run continues the epoch after the
        batches already handed out, exactly, where the sampler's order is a function of its epoch. The workers live until :meth:`close` or until the object is collected.

    Example::

        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> loader = SpanningLoader(DataLoader(list(range(6)), batch_size=2))
        >>> [[b.tolist() for b in loader] for epoch in range(2)]
        [[[0, 1], [2, 3], [4, 5]], [[0, 1], [2, 3], [4, 5]]]
    """

    def __init__(self, loader: DataLoader, batches_per_epoch: int | None = None) -> None:
        if not isinstance(loader, DataLoader):
            raise ValueError(f"loader must be a torch.utils.data.DataLoader, got {type(loader).__name__}.")
        if isinstance(loader.dataset, IterableDataset):
            raise ValueError(
                "loader reads an IterableDataset, which has no epochs of indices to chain; SpanningLoader needs a "
                "map-style dataset (one with __getitem__ and __len__)."
            )
        checks.check_int("batches_per_epoch", batches_per_epoch, low=1, allow_none=True)
        self.source, self.batches_per_epoch = loader, batches_per_epoch
        #: the source states it: its workers load across epoch ends (a new worker count would restart them)
        loader._spanned_by = weakref.ref(self)
        # batch_size=None: the sampler itself yields what to fetch
        self._batched = loader.batch_sampler is not None
        self._chain = _EpochAfterEpoch(loader.batch_sampler if self._batched else loader.sampler, loader.sampler,
                                       batches_per_epoch)  # fmt: skip
        self._iterator: Iterator[Any] | None = None
        self._left = 0  # batches of the current epoch not handed out yet
        self._epochs = 0  # epochs begun by iter() since the chain's first
        self._handed = 0  # batches of the current epoch handed out (a resumed epoch counts from its start)
        self._saved: dict[str, Any] | None = None  # a place to start at (load_state_dict)

    #: marks the wrapper for :func:`~lightning_gpu_boost.core.loaders.iter_loaders` (worker tuners reach the source)
    spans_epochs = True

    def _build(self) -> DataLoader:
        """The loader that runs, from the source's settings now (a worker tuner may have changed them since)."""
        loader, workers = self.source, self.source.num_workers
        chain = {"batch_sampler": self._chain} if self._batched else {"sampler": self._chain, "batch_size": None}
        return DataLoader(
            loader.dataset,
            **chain,
            num_workers=workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
            timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
            **({"prefetch_factor": loader.prefetch_factor or 2} if workers else {}),
            pin_memory_device=loader.pin_memory_device, in_order=getattr(loader, "in_order", True),
        )  # fmt: skip

    def __len__(self) -> int:
        n = len(self.source)
        return n if self.batches_per_epoch is None else min(n, self.batches_per_epoch)

    @property
    def sampler(self) -> Any:
        """The loader's sampler (Lightning sets its epoch; the chain sets each epoch it draws itself)."""
        return self.source.sampler

    @property
    def batch_sampler(self) -> Any:
        """The loader's batch sampler (``None`` for ``batch_size=None`` loaders), as Lightning's checks read it."""
        return self.source.batch_sampler

    @property
    def batch_size(self) -> int | None:
        return self.source.batch_size

    @property
    def dataset(self) -> Any:
        return self.source.dataset

    @property
    def num_workers(self) -> int:
        return self.source.num_workers

    @property
    def prefetch_factor(self) -> int | None:
        """Batches each worker keeps in flight (the source's; 2 where it has none and workers are set later): with
        ``num_workers`` the loader's queue, as :func:`~lightning_gpu_boost.core.steady.queue_batches` reads it."""
        return (self.source.prefetch_factor or 2) if self.source.num_workers else None

    @property
    def worker_init_fn(self) -> Any:
        """The source's ``worker_init_fn``; set through to it (Lightning adds its seeding function here with
        ``seed_everything(workers=True)``), read when the workers start."""
        return self.source.worker_init_fn

    @worker_init_fn.setter
    def worker_init_fn(self, fn: Any) -> None:
        self.source.worker_init_fn = fn

    def __iter__(self) -> Iterator[Any]:
        start = 0
        if self._iterator is None:
            saved, self._saved = self._saved, None
            epoch = sampler_epoch(self.source.sampler)
            start = resume_start(saved, epoch, len(self))
            self._chain.skip = start  # the chain's first epoch is the sampler's now
            self._iterator = iter(self._build())
            self._left = 0
        for _ in range(self._left):  # the previous epoch was left early: skip what it did not use
            next(self._iterator)
        self._left = len(self) - start
        self._epochs += 1
        self._handed = start
        while self._left > 0:
            self._left -= 1
            batch = next(self._iterator)
            self._handed += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch": e, "batches": k}``: ``k`` batches of epoch ``e`` handed out (as
        :class:`~lightning_gpu_boost.core.resume.ResumableDataLoader` says it)."""
        started = self._epochs > 0 and self._chain.epoch is not None  # the chain read its first epoch
        return {"epoch": self._chain.first + self._epochs - 1 if started else None, "batches": self._handed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start at ``state`` when the workers next start: the epoch the loop asks for continues after the batches
        handed out (another epoch, or a finished one, starts at its beginning)."""
        if state:
            self._saved = dict(state)

    def close(self) -> None:
        """Stop the workers; the next ``iter()`` starts them again at the epoch after the last one handed out
        (the chain may have drawn further ahead: that look-ahead is dropped)."""
        if self._iterator is not None and self._chain.epoch is not None:
            self._chain.epoch = self._chain.first + self._epochs
        self._iterator, self._left = None, 0

    def __repr__(self) -> str:
        return f"SpanningLoader({self.source!r}, batches_per_epoch={self.batches_per_epoch})"


#: :func:`span_decision`'s default: span a loader whose epoch start is estimated to cost at least this share of it
RESTART_SHARE = 0.05


def restart_share(batches: int, workers: int) -> float:
    """About the share of an epoch of ``batches`` batches that passes waiting at its start when ``workers``
    workers begin it afresh (a new iterator, or persistent workers woken): the first batch takes one worker a
    whole batch, which at the loader's steady pace is ``workers`` batches' time; ``workers / (batches +
    workers)``. Workers started again (not persistent) also pay their start-up on top."""
    if workers <= 0 or batches <= 0:
        return 0.0
    return workers / (batches + workers)


def span_decision(loader: Any, batches: int | None, min_share: float = RESTART_SHARE) -> tuple[bool, str]:
    """Whether to wrap ``loader`` in a :class:`SpanningLoader` for epochs of ``batches`` batches (``None``: the
    loader's length), and why: only a ``DataLoader`` over a map-style dataset with workers, whose dataset has no
    ``set_epoch`` (a dataset that changes per epoch must not see the next epoch loaded early), and whose epoch start
    costs at least ``min_share`` of an epoch (:func:`restart_share`), and that keeps no resume state of its own.
    """
    if not isinstance(loader, DataLoader):
        return False, f"a {type(loader).__name__}, not a DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return False, "an IterableDataset has no epochs of indices"
    if callable(getattr(loader, "state_dict", None)) and not isinstance(loader, ResumableDataLoader):
        # a loader that keeps its own resume state (torchdata's StatefulDataLoader): Lightning saves and restores it
        # only where it is the train loader itself, not wrapped
        return False, f"{type(loader).__name__} keeps its own resume state, which Lightning saves only unwrapped"
    if loader.num_workers <= 0:
        return False, "no workers to keep loading"
    if getattr(loader.collate_fn, "refill", False):
        return False, "its batches are re-formed after skipped bad samples (bad_samples='skip')"
    if callable(getattr(loader.dataset, "set_epoch", None)):
        return False, "its dataset has set_epoch (it may change per epoch: the next epoch must not load early)"
    try:
        n = len(loader) if batches is None else batches
    except TypeError:
        return False, "it has no length"
    share = restart_share(n, loader.num_workers)
    about = f"{n} batches per epoch, {loader.num_workers} workers: each epoch's start costs about {share:.0%} of it"
    if share < min_share:
        return False, f"{about} (below {min_share:.0%})"
    return True, about
