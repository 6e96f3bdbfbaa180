"""``SpanEpochs``: the Lightning adapter of :class:`~lightning_gpu_boost.core.spanning.SpanningLoader`, chosen per
loader where short epochs make each epoch's start a large share of it."""

from __future__ import annotations

import weakref
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost.callbacks._data_path import (
    RESUME_CHECK,
    add_stage,
    check_resumed_places,
    data_path,
    remove_stage,
)
from lightning_gpu_boost.core.run_record import run_record
from lightning_gpu_boost.core.spanning import RESTART_SHARE, SpanningLoader, resumable, span_decision

__all__ = ['SpanEpochs']


def _batches(length: int, limit: int | float) -> int | None:
    """Batches per epoch of a loader of ``length`` batches under Lightning's ``limit_*_batches`` (an int caps it);
    ``None`` for a fraction below 1, which Lightning would apply again to the wrapped loader's length."""
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(length, limit)
    if isinstance(limit, float) and limit < 1.0:
        return None
    return length


class SpanEpochs(Callback):
    """Keep the workers of short-epoch loaders loading across epoch ends: wrap them in ``SpanningLoader``.

    A DataLoader's workers start an epoch's batches only when the epoch begins, so each epoch first waits while one
    worker loads a whole batch (and workers that are not persistent start again first); each validation pass does
    the same. When Lightning sets up the fit's training and validation loaders (after DDP gave them their
    ``DistributedSampler``, after a worker tuner chose their counts), each ``DataLoader`` over a map-style dataset,
    with workers, whose epoch start costs at least ``min_restart_share`` of its epoch (estimated as ``num_workers /
    (batches + num_workers)``: epochs of fewer than about 19 batches per worker at the default) is wrapped in a
    :class:`~lightning_gpu_boost.core.spanning.SpanningLoader`: one iterator whose workers load the next epoch's
    batches while this one ends and validates, every sample still once per epoch in the sampler's order, and a
    validation pass limited by ``limit_val_batches`` loads only the batches it uses. Part of :class:`GPUBoost`.

    Left alone: loaders with ``num_workers=0``, iterable datasets, datasets with a ``set_epoch`` method (they may
    change per epoch), loaders that are not DataLoaders, and every loader when ``reload_dataloaders_every_n_epochs``
    is set. Caveats (those of ``SpanningLoader``): the next epoch's batches load before ``on_train_epoch_start``
    runs, so a dataset that the main process changes per epoch must not be spanned (pass ``train=False`` or
    ``GPUBoost(span_epochs=False)``; persistent workers, which worker tuners turn on, do not see such changes either).
    A run resumed from any checkpoint continues exactly where the uninterrupted run was (the wrapped loader saves
    its place in Lightning's loop state).

    Logged metrics:
        None; an info line per loader it wraps, naming its batches, workers and the estimated share.

    Args:
        train: consider the training loaders.
        val: consider the validation loaders (their passes limited by ``limit_val_batches``).
        min_restart_share: wrap a loader when its epoch start is estimated to cost at least this share of an epoch,
            in ``[0, 1)``; ``0`` wraps every loader that can be wrapped.

    Raises:
        ValueError: a ``min_restart_share`` outside ``[0, 1)``, non-bool ``train`` or ``val``.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_gpu_boost.callbacks import AutoNumWorkers, SpanEpochs
        >>> trainer = Trainer(callbacks=[AutoNumWorkers(), SpanEpochs()], logger=False, enable_progress_bar=False)
    """

    def __init__(self, train: bool = True, val: bool = True, min_restart_share: float = RESTART_SHARE) -> None:
        checks.check_bool("train", train)
        checks.check_bool("val", val)
        checks.check_number("min_restart_share", min_restart_share, low=0.0, high=1.0, high_open=True)
        self.train, self.val, self.min_restart_share = train, val, min_restart_share
        #: ``(stage, wrapped, why)`` for each loader considered in the last fit
        self.decisions: list[tuple[str, bool, str]] = []
        self._spanning: list[SpanningLoader] = []
        self._span_next_fit = False  # set where a fit ended showing that its train loader should have been spanned
        self._blocked: str | None = None  # why the train loader could not be spanned whatever the threshold
        self._trainer: Any = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.reload_dataloaders_every_n_epochs:
            rank_zero_info("SpanEpochs: off (reload_dataloaders_every_n_epochs builds new loaders every few epochs).")
            return
        self.decisions = []
        stages = {name for name, on in (("train", self.train), ("val", self.val)) if on}

        def hook(dataloader: object, loader_stage: str | None) -> object:
            if loader_stage not in stages:
                return self._resumable(dataloader) if loader_stage == "train" else dataloader
            given = dataloader
            if isinstance(dataloader, SpanningLoader) and not dataloader.span:  # made resumable by an earlier part
                dataloader = dataloader.source
            limit = trainer.limit_train_batches if loader_stage == "train" else trainer.limit_val_batches
            try:
                length: int | None = len(dataloader)  # type: ignore[arg-type]
            except TypeError:  # no length: span_decision says so
                length = None
            batches = None if length is None else _batches(length, limit)
            if length is not None and batches is None:
                span, why = False, f"limit_{loader_stage}_batches={limit} is a fraction (an int limit can be spanned)"
            elif batches == 0:
                span, why = False, "no batches per epoch"
            else:
                span, why = span_decision(dataloader, batches, self.min_restart_share)
            if loader_stage == "train" and self._span_next_fit:  # decided again after the last fit (see below)
                span, why = span_decision(dataloader, batches, 0.0) if batches else (span, why)
            self.decisions.append((loader_stage, span, why))
            if loader_stage == "train":  # whether anything but the threshold kept it from spanning (asked again)
                self._blocked = None if span or not batches or span_decision(dataloader, batches, 0.0)[0] else why
            if loader_stage == "train":  # the run record: asked again instead of advised a threshold
                run_record(trainer).choose("span_epochs", span, by="SpanEpochs", why=why, decide_again=self._again)
            if not span or batches is None or length is None:  # a train loader stays resumable
                return self._resumable(given) if loader_stage == "train" else given
            full = batches >= length
            wrapped = SpanningLoader(dataloader, None if full else batches)  # type: ignore[arg-type]
            self._spanning.append(wrapped)
            # its workers load across epoch ends: a new worker count would restart them (the worker tuners ask)
            data_path(trainer).facts(dataloader).spanning = weakref.ref(wrapped)
            rank_zero_info(f"SpanEpochs: the {loader_stage} loader's workers load across epoch ends ({why}).")
            return wrapped

        add_stage(trainer, "span_epochs", f"SpanEpochs-{id(self)}", hook)
        self._trainer = trainer

    def _again(self, proposal: bool, reason: str, **evidence: Any) -> tuple[bool, str]:
        """The run showed ``reason`` with the train loader's workers restarting each epoch: its loader cannot be
        swapped mid-fit, so the next fit of this callback spans it, whatever the estimate."""
        if self._blocked is not None:  # not the threshold: the loader cannot be spanned at all
            return False, f"SpanEpochs keeps the train loader as it is although {reason}: {self._blocked}."
        self._span_next_fit = bool(proposal)
        return False, (f"SpanEpochs decided again: {reason} (its estimate was below its threshold); the next fit with "
                       "this callback keeps the train loader's "
                       "workers loading across epoch ends (this fit's loader cannot be swapped mid-fit).")  # fmt: skip

    def _resumable(self, loader: Any) -> Any:
        """``loader`` made resumable (:func:`~lightning_gpu_boost.core.spanning.resumable`); a wrapper made here is
        closed at teardown."""
        wrapped = resumable(loader)
        if wrapped is not loader:
            self._spanning.append(wrapped)
        return wrapped

    @override
    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        # read before the loaders are built: a saved place they cannot continue is refused in the loader hook
        check_resumed_places(trainer, checkpoint)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning calls no teardown after a failed or interrupted fit: the workers and their batches go here
        self.teardown(trainer, pl_module, "fit")

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for loader in self._spanning:
            loader.close()
        self._spanning.clear()
        if self._trainer is not None:
            remove_stage(self._trainer, f"SpanEpochs-{id(self)}")
            remove_stage(self._trainer, RESUME_CHECK)
            self._trainer = None
