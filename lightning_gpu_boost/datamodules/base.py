"""``BoostDataModule``: a LightningDataModule base that builds fast DataLoaders from the datasets you give it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Dataset

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost._job import job_probe, lightning_worker_seed
from lightning_gpu_boost.core.cpus import default_num_workers, processes_per_node
from lightning_gpu_boost.core.loaders import LowPriorityWorkerInit
from lightning_gpu_boost.core.resume import ResumableDataLoader, gather_ranks, own_rank

__all__ = ['BoostDataModule', 'RefillDataLoader', 'Stage']

Stage = Literal["train", "val", "test", "predict"]


def _bad_sample_owner(dataset: Any) -> Any:
    """The dataset (under ``Subset`` wrappers) that skips bad samples and counts them, or None."""
    while dataset is not None and not hasattr(dataset, "bad_sample_tracker") and hasattr(dataset, "dataset"):
        dataset = dataset.dataset
    if getattr(dataset, "bad_samples", None) == "skip" and hasattr(dataset, "bad_sample_tracker"):
        return dataset
    return None


class RefillDataLoader(ResumableDataLoader):
    """A DataLoader whose batches stay full when bad samples are skipped: with a
    :class:`~lightning_gpu_boost.core.bad_samples.SkipBadCollate` (``refill=True``) as its ``collate_fn``, its
    iterator is wrapped in :class:`~lightning_gpu_boost.core.refill.Refill`, which re-forms the batches that
    skipped samples left short from the samples that follow (each good sample once, in order; as many batches as
    ``len()``). Any other collate function: a :class:`~lightning_gpu_boost.core.resume.ResumableDataLoader`.
    With a :attr:`bad_sample_log` (:class:`~lightning_gpu_boost.core.bad_samples.BadSampleLog`), each pass ends with
    one warning naming the samples it skipped.
    Lightning re-creates it like any DataLoader (its ``DistributedSampler`` under DDP). Resumes exactly mid-epoch:
    its state holds each rank's place in the re-formed batches (ranks skip different samples)."""

    def _refills(self) -> bool:
        from lightning_gpu_boost.core.bad_samples import SkipBadCollate

        return isinstance(self.collate_fn, SkipBadCollate) and self.collate_fn.refill and bool(self.batch_size)

    #: where this loader reports the bad samples each pass skipped (set by the DataModules; ``None``: not reported)
    bad_sample_log: Any = None

    def __iter__(self):
        log = self.bad_sample_log
        if log is None:
            yield from self._batches()
            return
        yield from log.watch(self._batches(), self._epoch() if log.stage == "train" else None)

    def _batches(self):
        if not self._refills():
            yield from super().__iter__()
            return
        from lightning_gpu_boost.core.refill import Refill

        saved, epoch = self._take_saved()
        resume = saved.get("refill") if saved else None
        self._skip(epoch, int(resume["source"]) if resume else 0)
        refill = Refill(DataLoader.__iter__(self), self.batch_size, self._length(), warn=rank_zero_warn,
                        resume=resume)  # fmt: skip
        self._refill = refill
        self._place = (epoch, int(resume["emitted"]) if resume else 0)
        for batch in refill:
            self._place = (epoch, self._place[1] + 1)
            yield batch

    def local_state_dict(self) -> dict:
        """This rank's place (what :meth:`state_dict` gathers from every rank)."""
        state = super().state_dict()
        refill = getattr(self, "_refill", None)
        if self._refills() and refill is not None:
            state["refill"] = refill.position()
        return state

    def state_dict(self) -> dict:
        """Every rank's place (a collective under DDP: Lightning calls it on every rank as it saves)."""
        return gather_ranks(self.local_state_dict())

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(own_rank(state) if state else state)


class BoostDataModule(pl.LightningDataModule):
    """A LightningDataModule that turns your datasets into DataLoaders with GPU-friendly defaults.

    Subclasses implement :meth:`train_dataset` (and optionally :meth:`val_dataset`, :meth:`test_dataset`,
    :meth:`predict_dataset`); this class builds every DataLoader with:

    - ``pin_memory`` when the Trainer trains on CUDA (page-locked batches copy asynchronously),
    - ``persistent_workers`` and ``prefetch_factor`` when workers are used,
    - a worker count from the CPUs this process may use (affinity mask and cgroup quota, shared among the
      processes on the node, one kept for the main process), or ``num_workers="auto"`` to measure it,
    - ``drop_last`` and ``collate_fn`` options, shuffling for training only.

    DataLoaders are real ``torch.utils.data.DataLoader`` objects built inside ``*_dataloader()``. The shuffled
    training loader draws its order from a :class:`~lightning_gpu_boost.core.block_shuffle.BlockShuffleSampler`
    with blocks of one record (a full shuffle, a new one each epoch, seeded by Lightning's ``seed_everything`` seed
    or 0): a ``DistributedSampler`` that Lightning keeps under DDP (each rank a contiguous share), and whose loader
    (:class:`~lightning_gpu_boost.core.resume.ResumableDataLoader`) saves where the epoch stands, so a run
    resumed from a mid-epoch checkpoint neither repeats nor skips a batch. Other loaders get Lightning's
    ``DistributedSampler`` under DDP as usual.

    Args:
        batch_size: samples per batch, ``>= 1``.
        num_workers: worker processes per DataLoader: an int ``>= 0``, ``None`` for the usable-CPU default, or
            ``"auto"`` to measure the best count per stage (see
            :func:`~lightning_gpu_boost.core.workers.tune_num_workers`; cached on disk, same on every DDP rank).
        pin_memory: ``None`` pins exactly when the Trainer's root device is CUDA.
        persistent_workers: keep workers alive between epochs (only used when ``num_workers > 0``).
        prefetch_factor: batches loaded ahead by each worker (only used when ``num_workers > 0``), ``>= 1``.
        drop_last: drop the last incomplete training batch.
        shuffle: shuffle the training set.
        collate_fn: custom collate function (default: PyTorch's ``default_collate``).
        normalize: ``(mean, std)`` per channel in ``[0, 1]`` units: uint8 image tensors ``(N, C, H, W)`` reach the
            step normalized (float32): on the GPU's side stream by ``StreamPrefetch`` (or ``GPUBoost``), else after
            the batch's transfer, on its device (the CPU in a CPU run: the same values); a loader made outside a
            Trainer (passed straight to ``fit``, or iterated by hand) is normalized by its workers.
            ``None``: batches reach the step as the dataset makes them.
        workers_budget_s: time budget of one ``num_workers="auto"`` probe in seconds.
        worker_niceness: run workers this much nicer than the training process (0 = same priority), for when
            the training process needs CPU time that busy workers would take; Lightning's worker seeding still
            applies.

    Raises:
        ValueError: an argument is out of range (the message names the value and what is valid).

    Example::

        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> class Random(BoostDataModule):
        ...     def train_dataset(self):
        ...         return TensorDataset(torch.randn(64, 32), torch.randint(0, 2, (64,)))
        >>> dm = Random(batch_size=16, num_workers=0)
        >>> len(dm.train_dataloader())
        4
    """

    def __init__(
        self,
        batch_size: int = 32,
        num_workers: int | Literal["auto"] | None = None,
        pin_memory: bool | None = None,
        persistent_workers: bool = True,
        prefetch_factor: int = 4,
        drop_last: bool = False,
        shuffle: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
        workers_budget_s: float = 30.0,
        worker_niceness: int = 0,
    ) -> None:
        super().__init__()
        checks.check_bool("pin_memory", pin_memory, allow_none=True)
        for name, value in (("persistent_workers", persistent_workers), ("drop_last", drop_last),
                            ("shuffle", shuffle)):  # fmt: skip
            checks.check_bool(name, value)
        checks.check_number("workers_budget_s", workers_budget_s, low=0.0, low_open=True)
        checks.check_int("worker_niceness", worker_niceness, low=0, high=19)
        checks.check_callable("collate_fn", collate_fn)
        checks.check_normalize("normalize", normalize)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}.")
        if (
            num_workers is not None
            and num_workers != "auto"
            and (not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0)
        ):
            raise ValueError(f"num_workers must be an int >= 0, None or 'auto', got {num_workers!r}.")
        if not isinstance(prefetch_factor, int) or isinstance(prefetch_factor, bool) or prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be an int >= 1, got {prefetch_factor!r}.")
        if normalize is not None:
            from lightning_gpu_boost.core.prefetch import as_normalize

            normalize = as_normalize(normalize)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.collate_fn = collate_fn
        self.normalize = normalize
        self._normalizer: Any = None
        self._said_straight = False
        self._as_in_a_trainer = False
        #: stage -> what ``num_workers="auto"`` measured
        self.auto_probes: dict[str, Any] = {}
        self.workers_budget_s = workers_budget_s
        self.worker_niceness = worker_niceness

    # -- what subclasses fill in ------------------------------------------------------------------------------
    def train_dataset(self) -> Dataset:
        """The training dataset. Subclasses must implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement train_dataset().")

    def val_dataset(self) -> Dataset | None:
        """The validation dataset, or ``None`` for no validation."""
        return None

    def test_dataset(self) -> Dataset | None:
        """The test dataset, or ``None``."""
        return None

    def predict_dataset(self) -> Dataset | None:
        """The prediction dataset, or ``None``."""
        return None

    # -- the seams later features plug into ------------------------------------------------------------------
    def resolve_num_workers(self, dataset: Dataset, stage: Stage) -> int:
        """The worker count for ``stage``: the explicit value; ``"auto"``: measured (once per stage, cached on
        disk, agreed by all DDP ranks); ``None``: the usable-CPU default."""
        if isinstance(self.num_workers, int):
            return self.num_workers
        if self.num_workers == "auto" and (dataset is not None or stage in self.auto_probes):
            if stage not in self.auto_probes:
                # the CPU-aware default is "the user's value": kept where the probe cannot rank the counts
                from lightning_gpu_boost.core.bad_samples import SkipBadCollate

                collate = SkipBadCollate(self.collate_fn) if _bad_sample_owner(dataset) else self.collate_fn
                probe_loader = DataLoader(
                    dataset, batch_size=self.batch_size, shuffle=stage == "train", collate_fn=collate,
                    num_workers=default_num_workers(processes_per_node(self.trainer)),
                )  # fmt: skip
                probe = job_probe(self.trainer, probe_loader, budget_s=self.workers_budget_s)
                self.auto_probes[stage] = probe
                how = "from an earlier measurement (cache)" if probe.cached else "measured"
                rank_zero_info(f"{type(self).__name__}: {stage} num_workers={probe.num_workers} ({how}).\n"
                               f"{probe.format_table()}")  # fmt: skip
            return self.auto_probes[stage].num_workers
        return default_num_workers(processes_per_node(self.trainer))

    def resolve_pin_memory(self) -> bool:
        """``pin_memory`` if set, else whether the Trainer's root device is CUDA."""
        if self.pin_memory is not None:
            return self.pin_memory
        trainer = self.trainer
        return trainer is not None and trainer.strategy.root_device.type == "cuda"

    def dataloader_kwargs(self, dataset: Dataset, stage: Stage) -> dict[str, Any]:
        """Keyword arguments of the DataLoader for ``stage``; override to change any of them."""
        workers = self.resolve_num_workers(dataset, stage)
        train = stage == "train"
        kwargs: dict[str, Any] = {
            "batch_size": self.batch_size,
            "shuffle": self.shuffle and train,
            "num_workers": workers,
            "pin_memory": self.resolve_pin_memory(),
            "drop_last": self.drop_last and train,
            "collate_fn": self.collate_fn,
        }
        if workers > 0:
            kwargs["persistent_workers"] = self.persistent_workers
            kwargs["prefetch_factor"] = self.prefetch_factor
            if self.worker_niceness:
                rank = self.trainer.global_rank if self.trainer is not None else 0
                kwargs["worker_init_fn"] = LowPriorityWorkerInit(lightning_worker_seed(rank), self.worker_niceness)
        return kwargs

    def make_dataloader(self, dataset: Dataset, stage: Stage) -> DataLoader:
        """Build the DataLoader for ``stage`` from ``dataset``. A dataset with ``bad_samples="skip"`` (ours, or
        any with a ``bad_sample_tracker``) gets :class:`~lightning_gpu_boost.core.bad_samples.SkipBadCollate`
        around the collate function and a :class:`RefillDataLoader` (full batches: a batch a skipped sample left
        short takes the next samples) that warns at each pass's end with the samples it skipped (its
        ``bad_sample_log``, which :class:`~lightning_gpu_boost.callbacks.BadSampleReport` logs as a metric)."""
        from lightning_gpu_boost.core.block_shuffle import BlockShuffleSampler

        kwargs = self.dataloader_kwargs(dataset, stage)
        if stage == "train" and kwargs.get("shuffle") and kwargs.get("sampler") is None and _sized(dataset):
            kwargs.pop("shuffle")
            seed = int(os.environ.get("PL_GLOBAL_SEED", 0) or 0)  # Lightning's DistributedSampler seed
            kwargs["sampler"] = BlockShuffleSampler(dataset, block_size=1, window_blocks=1, seed=max(0, seed))
        # the training loader resumes exactly mid-epoch (a full shuffle is a block order of one-record blocks)
        loader_class = ResumableDataLoader if stage == "train" else DataLoader
        if self.normalize is not None:
            kwargs.setdefault("normalize", self.normalize)
        owner = _bad_sample_owner(dataset)
        if owner is not None:
            from lightning_gpu_boost.core.bad_samples import SkipBadCollate

            kwargs["collate_fn"] = SkipBadCollate(kwargs.get("collate_fn"), refill=True)
            loader_class = RefillDataLoader
        normalize = self._normalize_in_workers(kwargs, kwargs.pop("normalize", None), stage)
        loader = loader_class(dataset, **kwargs)
        if owner is not None:
            from lightning_gpu_boost.core.bad_samples import BadSampleLog

            loader.bad_sample_log = BadSampleLog(owner, stage, warn=rank_zero_warn)
        # how this loader's uint8 images are normalized, in the data path's record (StreamPrefetch does it on the
        # GPU's side stream; else :meth:`on_after_batch_transfer`, on whatever device the batch is on)
        self._record_normalize(loader, normalize)
        if stage == "train" and self.num_workers == "auto" and self.trainer is not None and stage in self.auto_probes:
            self._record_workers(loader)
        return loader

    @contextlib.contextmanager
    def loaders_as_in_a_trainer(self) -> Iterator[None]:
        """Loaders made inside are the ones a Trainer gets (uint8 images, normalized after the copy), for tools that
        measure a loader alone as training will iterate it (``doctor``, the benchmarks)."""
        self._as_in_a_trainer = True
        try:
            yield
        finally:
            self._as_in_a_trainer = False

    def _normalize_in_workers(self, kwargs: dict[str, Any], normalize: Any, stage: Any) -> Any:
        """A loader made outside a Trainer (passed straight to ``fit``, or iterated by hand): no hook of ours is sure
        to normalize its uint8 images, so its workers do (``collate_fn`` in ``kwargs`` wrapped), and ``None`` is
        returned; else ``normalize``, for the Trainer's hooks."""
        if normalize is None or self.trainer is not None or self._as_in_a_trainer:
            return normalize
        kwargs["collate_fn"] = NormalizedCollate(kwargs.get("collate_fn"), normalize)
        if not self._said_straight:
            self._said_straight = True
            rank_zero_info(f"{type(self).__name__}: a {stage} loader made outside a Trainer hands normalized float32 "
                           "images made by its workers; pass the DataModule as `datamodule=` to send uint8 and "
                           "normalize on the GPU.")  # fmt: skip
        return None

    def _record_normalize(self, loader: Any, normalize: Any) -> None:
        if normalize is not None and self.trainer is not None:
            from lightning_gpu_boost.callbacks._data_path import data_path

            data_path(self.trainer).facts(loader).normalize = normalize

    def _record_workers(self, loader: DataLoader) -> None:
        """State the measured worker count in the run record, with how to decide it again in training."""
        import functools

        from lightning_gpu_boost.core.loaders import set_num_workers
        from lightning_gpu_boost.core.run_record import run_record
        from lightning_gpu_boost.core.workers import decide_workers_again

        probe, who = self.auto_probes["train"], f"{type(self).__name__}(num_workers='auto')"
        apply = functools.partial(set_num_workers, loader, prefetch_factor=self.prefetch_factor,
                                  persistent_workers=self.persistent_workers, worker_niceness=self.worker_niceness)  # fmt: skip

        def again(proposal: int, reason: str, training_batches_s: float | None = None) -> tuple[int, str]:
            from lightning_gpu_boost.callbacks._data_path import facts_of

            facts = facts_of(self.trainer, loader)
            value, said = decide_workers_again(probe, loader, proposal, reason, who, apply,
                                               training_batches_s=training_batches_s,
                                               spanning=facts.spanned_by() if facts else None)  # fmt: skip
            rank_zero_info(said)
            return value, said

        run_record(self.trainer).choose("num_workers", loader.num_workers, by=who, why=probe.reason or "measured",
                                        decide_again=again)  # fmt: skip

    # -- LightningDataModule hooks ----------------------------------------------------------------------------
    def _loader(self, stage: Stage) -> DataLoader | list:
        dataset = getattr(self, f"{stage}_dataset")()
        if dataset is None:
            if stage == "train":
                raise ValueError(
                    f"{type(self).__name__}.train_dataset() returned None; it must return a Dataset."
                )
            return []
        return self.make_dataloader(dataset, stage)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader | list:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader | list:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader | list:
        return self._loader("predict")

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """uint8 images ``(N, C, H, W)`` normalized with ``normalize`` where nothing did it before (the prefetcher
        does it on the GPU's side stream), on the device the batch is on: a CPU run hands the step the same
        normalized floats as a GPU run."""
        if self.normalize is None:
            return batch
        if self._normalizer is None:
            from lightning_gpu_boost.core.prefetch import GPUNormalize

            self._normalizer = GPUNormalize(*self.normalize)
        return self._normalizer(batch)


class NormalizedCollate:
    """A collate function whose batches' uint8 images ``(N, C, H, W)`` come out normalized float32 (in the worker
    that collates): the loaders a DataModule makes outside a Trainer."""

    def __init__(self, collate_fn: Any, normalize: tuple[tuple[float, ...], tuple[float, ...]]) -> None:
        from lightning_gpu_boost.core.prefetch import GPUNormalize

        self.collate_fn, self.normalize = collate_fn, GPUNormalize(*normalize)

    def __call__(self, samples: Any) -> Any:
        from torch.utils.data import default_collate

        batch = (self.collate_fn or default_collate)(samples)
        return batch if batch is None else self.normalize(batch)


def _sized(dataset: Any) -> bool:
    try:
        return len(dataset) >= 0
    except TypeError:
        return False
