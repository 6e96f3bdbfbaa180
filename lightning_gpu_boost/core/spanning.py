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

import warnings
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost.core.epoch_order import EpochOrder, unplaceable
from lightning_gpu_boost.core.loaders import shutdown_workers
from lightning_gpu_boost.core.resume import (
    PLACE_VERSION,
    ResumableDataLoader,
    check_place,
    gather_ranks,
    loader_settings,
    own_rank,
    resume_start,
    sampler_epoch,
)

__all__ = ['RESTART_SHARE', 'SpanningLoader', 'resumable', 'restart_share', 'span_decision']


class _Epochs:
    """The batches (lists of indices) of an :class:`~lightning_gpu_boost.core.epoch_order.EpochOrder`, from epoch
    :attr:`epoch` on (its first :attr:`skip` batches left out), the first ``limit`` of each epoch where given:
    one epoch after another without end (``endless``), or one epoch per iteration."""

    def __init__(self, order: EpochOrder, limit: int | None, endless: bool) -> None:
        self.order, self.limit, self.endless = order, limit, endless
        self.epoch = 0  # the epoch the next pass draws
        self.skip = 0  # batches of that epoch handed out before (a resumed run)

    def __iter__(self) -> Iterator[Any]:
        while True:
            skip, self.skip = self.skip, 0
            n = skip
            for batch in self.order.batches(self.epoch, skip):
                if self.limit is not None and n >= self.limit:
                    break
                n += 1
                yield batch
            self.epoch += 1
            if n == 0 or not self.endless:
                return  # one epoch per pass, or an empty sampler: no endless loop

    def __len__(self) -> int:  # one pass (the DataLoader's length where it is not endless)
        n = len(self.order.index_sampler)
        return n if self.limit is None else min(n, self.limit)


class SpanningLoader:
    """Iterate ``loader`` epoch by epoch through one iterator whose workers never stop between epochs, and resume
    it exactly mid-epoch.

    Each ``iter()`` yields one epoch: ``len(loader)`` batches, or ``batches_per_epoch`` where given (the first ones of
    each epoch's order: a validation pass limited to a few batches then loads only those). The workers keep
    ``num_workers x prefetch_factor`` batches in flight across the epoch's end, so the next epoch's first batches
    are ready when it starts. If an epoch is left before its last batch, the next ``iter()`` first discards the
    batches the previous epoch left (already loaded or in flight), so each epoch still starts at its own first
    batch. With ``span=False`` each ``iter()`` starts a new iterator (the workers as the loader's
    ``persistent_workers`` says), and the loader still resumes exactly.

    Its workers' loader is a second ``DataLoader`` built from ``loader``'s settings: the one iterator needs an index
    sampler that runs on from epoch to epoch and starts where a checkpoint left off, and a user's loader cannot be
    given one without changing it.

    Resumable mid-epoch (``state_dict`` / ``load_state_dict``, saved by Lightning with its loop state): the state
    holds the epoch, the batches of it handed out, the seed of its random order
    (:class:`~lightning_gpu_boost.core.epoch_order.EpochOrder`: a ``RandomSampler`` with or without a generator
    draws every epoch as the uninterrupted run did) and the settings the place depends on; a resume with other
    settings (another batch size, dataset length, process count) is refused naming the setting.

    Args:
        loader: a ``DataLoader`` over a map-style dataset (its sampler, batch size, workers, collate function,
            pinning and worker settings are kept).
        batches_per_epoch: batches handed out per epoch (e.g. Lightning's ``limit_val_batches``), ``>= 1``;
            ``None``: the whole epoch.
        span: keep one iterator across epochs; ``False``: a new one each epoch.

    Raises:
        ValueError: ``loader`` is not a DataLoader over a map-style dataset, a bad ``batches_per_epoch`` or
            ``span``; at ``load_state_dict``, a place saved with other settings.

    Caveats:
        The next epoch's batches are loaded before it begins: a dataset that changes per epoch (a curriculum, an
        augmentation strength set in ``on_train_epoch_start``) must not be used with it. Lightning injects its
        ``DistributedSampler`` only into ``DataLoader`` objects: under DDP give the loader a ``DistributedSampler``
        yourself before wrapping it. Worker tuners (``AutoNumWorkers``, ``GPUBoost``'s) tune the loader you wrap
        (:attr:`source`): the workers are started from its settings at the first ``iter()``. A sampler that is
        neither one of torch's nor has ``set_epoch`` may draw from random states no checkpoint holds: a resume
        says so once. The workers live until :meth:`close` or until the object is collected.

    Example::

        >>> import torch
        >>> from torch.utils.data import DataLoader
        >>> loader = SpanningLoader(DataLoader(list(range(6)), batch_size=2))
        >>> [[b.tolist() for b in loader] for epoch in range(2)]
        [[[0, 1], [2, 3], [4, 5]], [[0, 1], [2, 3], [4, 5]]]
    """

    def __init__(self, loader: DataLoader, batches_per_epoch: int | None = None, span: bool = True) -> None:
        if not isinstance(loader, DataLoader):
            raise ValueError(f"loader must be a torch.utils.data.DataLoader, got {type(loader).__name__}.")
        if isinstance(loader.dataset, IterableDataset):
            raise ValueError(
                "loader reads an IterableDataset, which has no epochs of indices to chain; SpanningLoader needs a "
                "map-style dataset (one with __getitem__ and __len__)."
            )
        checks.check_int("batches_per_epoch", batches_per_epoch, low=1, allow_none=True)
        checks.check_bool("span", span)
        self.source, self.batches_per_epoch = loader, batches_per_epoch
        # batch_size=None: the sampler itself yields what to fetch
        self._batched = loader.batch_sampler is not None
        self._order = EpochOrder(loader.batch_sampler if self._batched else loader.sampler)
        self._chain = _Epochs(self._order, batches_per_epoch, endless=span)
        self._inner: DataLoader | None = None  # the workers' loader (span=False: kept for its persistent workers)
        self._iterator: Iterator[Any] | None = None
        self._span = False
        self.span = span
        self._left = 0  # batches of the current epoch not handed out yet
        self._epoch: int | None = None  # the epoch handed out now (None: none yet)
        self._handed = 0  # batches of the current epoch handed out (a resumed epoch counts from its start)
        self._saved: dict[str, Any] | None = None  # a place to start at (load_state_dict)
        self._warned = False

    @property
    def span(self) -> bool:
        """Whether one iterator runs across epochs (settable until the first ``iter()``)."""
        return self._span

    @span.setter
    def span(self, value: bool) -> None:
        checks.check_bool("span", value)
        if self._iterator is not None or self._inner is not None:
            raise RuntimeError("SpanningLoader.span can be changed only before the first iter().")
        self._span = self._chain.endless = value

    @property
    def spans_epochs(self) -> bool:
        """Whether the workers load across epoch ends (:func:`~lightning_gpu_boost.core.loaders.iter_loaders`
        reaches the source through it)."""
        return self._span

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
            persistent_workers=bool(workers) and not self._span and loader.persistent_workers,
            pin_memory_device=loader.pin_memory_device, in_order=getattr(loader, "in_order", True),
        )  # fmt: skip

    def __len__(self) -> int:
        n = len(self.source)
        return n if self.batches_per_epoch is None else min(n, self.batches_per_epoch)

    @property
    def persistent_workers(self) -> bool:
        """Whether the workers outlive an epoch: always where they span epochs, else the source's setting."""
        return self._span or bool(self.source.persistent_workers)

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

    def __getattr__(self, name: str) -> Any:
        """Every other DataLoader attribute reads the source's: ``sampler`` (Lightning sets its epoch; the chain sets
        each epoch it draws itself), ``batch_sampler``, ``batch_size``, ``dataset``, ``num_workers``, ...
        (Lightning's checks and the worker tuners read them)."""
        if name.startswith("_") or name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)

    def _settings(self) -> dict[str, Any]:
        index = self.source.batch_sampler if self._batched else self.source.sampler
        return loader_settings(self.source.batch_size, self.source.drop_last, index)

    def _start(self) -> int:
        """Set the chain's first epoch from the saved place, the sampler's epoch or the last one handed out, and
        return the batches of it to skip."""
        saved, self._saved = self._saved, None
        sampler_at = sampler_epoch(self.source.sampler)  # set by Lightning where the sampler has set_epoch
        if saved and saved.get("seed") is not None:
            self._order.seed = int(saved["seed"])
        if saved and isinstance(saved.get("epoch"), int):
            epoch, k = int(saved["epoch"]), int(saved.get("batches", 0))
            if sampler_at is None:  # the place decides: within its epoch, or the next one after a finished epoch
                start = k if 0 < k < len(self) else 0
                first = epoch if start else epoch + (k >= len(self))
            else:
                first, start = sampler_at, resume_start(saved, sampler_at, len(self))
            if start:
                self._warn_unplaceable(start)
            return self._at(first, start)
        if self._epoch is not None:  # after close(): the epoch after the last one handed out
            return self._at(self._epoch + 1 if sampler_at is None else sampler_at, 0)
        return self._at(0 if sampler_at is None else sampler_at, 0)

    def _at(self, epoch: int, skip: int) -> int:
        self._chain.epoch, self._chain.skip = epoch, skip
        return skip

    def _warn_unplaceable(self, start: int) -> None:
        why = unplaceable(self._order.index_sampler)
        if why is not None and not self._warned:
            self._warned = True
            warnings.warn(f"Resuming {start} batches into an epoch of a loader whose order cannot be replayed ({why}): "
                          "the resumed epoch may repeat or skip samples. Give it a torch sampler or one with "
                          "set_epoch for an exact resume.", stacklevel=3)  # fmt: skip

    def __iter__(self) -> Iterator[Any]:
        start = 0
        if self._iterator is None:
            start = self._start()
            self._epoch = self._chain.epoch
            if self._inner is None or self._span:
                self._inner = self._build()
            self._iterator = iter(self._inner)
            self._left = 0
        else:  # the next epoch: the chain runs on into it (span), or a new pass draws it
            sampler_at = sampler_epoch(self.source.sampler)
            self._epoch = self._epoch + 1 if self._span or sampler_at is None else sampler_at  # type: ignore[operator]
            if not self._span:
                self._at(self._epoch, 0)
                self._iterator = iter(self._inner)  # type: ignore[arg-type]
                self._left = 0
        for _ in range(self._left):  # the previous epoch was left early: skip what it did not use
            next(self._iterator)
        self._left = len(self) - start
        self._handed = start
        while self._left > 0:
            self._left -= 1
            batch = next(self._iterator)
            self._handed += 1
            yield batch

    def local_state_dict(self) -> dict[str, Any]:
        """This process's place: ``{"version", "epoch": e, "batches": k, "seed", "settings"}``, ``k`` batches of
        epoch ``e`` handed out."""
        return {"version": PLACE_VERSION, "epoch": self._epoch, "batches": self._handed, "seed": self._order.seed,
                "settings": self._settings()}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """Every process's place (a collective under DDP: Lightning calls it on every rank as it saves)."""
        return gather_ranks(self.local_state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start at ``state`` when the workers next start: the epoch the loop asks for continues after the batches
        handed out (another epoch, or a finished one, starts at its beginning).

        Raises:
            ValueError: ``state`` was saved with other settings or by a newer version."""
        if state:
            state = own_rank(state)
            check_place(state, self._settings())
            self._saved = dict(state)

    def close(self) -> None:
        """Stop the workers; the next ``iter()`` starts them again at the epoch after the last one handed out
        (the chain may have drawn further ahead: that look-ahead is dropped)."""
        iterator, self._iterator, self._left = self._iterator, None, 0
        inner, self._inner = self._inner, None
        for it in (iterator, getattr(inner, "_iterator", None)):
            shutdown_workers(it)

    def __repr__(self) -> str:
        return f"SpanningLoader({self.source!r}, batches_per_epoch={self.batches_per_epoch}, span={self._span})"


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
    about = f"{n} batches per epoch, {loader.num_workers} worker{'s' if loader.num_workers != 1 else ''}: each epoch's start costs about {share:.0%} of it"
    if share < min_share:
        return False, f"{about} (below {min_share:.0%})"
    return True, about


def resumable(loader: Any) -> Any:
    """``loader`` made to resume exactly mid-epoch: a plain ``DataLoader`` over a map-style dataset is wrapped in a
    :class:`SpanningLoader` that does not span (``span=False``: its workers as the loader's settings say); a loader
    that keeps its own place (ours, torchdata's ``StatefulDataLoader``), one whose batches are re-formed after bad
    samples, an iterable dataset's, a non-DataLoader or one already wrapped is returned as it is (Lightning warns
    at a mid-epoch resume of one that keeps no place, as without us)."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    if callable(getattr(loader, "state_dict", None)) or getattr(loader.collate_fn, "refill", False):
        return loader
    return SpanningLoader(loader, span=False)
