"""``AutoNumWorkers``: the Lightning adapter of :func:`~lightning_gpu_boost.core.workers.tune_num_workers`."""

from __future__ import annotations

import functools
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost._job import job_probe, lightning_worker_seed
from lightning_gpu_boost._logging import node_info
from lightning_gpu_boost.callbacks._data_path import (
    RESUME_CHECK,
    add_stage,
    check_resumed_places,
    data_path,
    facts_of,
    remove_stage,
)
from lightning_gpu_boost.core.cpus import processes_per_node, usable_cpus
from lightning_gpu_boost.core.loaders import (
    AUTO_PERSISTENT_WORKERS,
    AUTO_PREFETCH_FACTOR,
    fixed_worker_count,
    iter_loaders,
    set_num_workers,
)
from lightning_gpu_boost.core.run_record import run_record
from lightning_gpu_boost.core.spanning import resumable
from lightning_gpu_boost.core.state_version import check_state_version
from lightning_gpu_boost.core.workers import WorkerProbe, decide_workers_again

__all__ = ['AutoNumWorkers']


class AutoNumWorkers(Callback):
    """Pick ``num_workers`` of the training (and optionally validation) DataLoaders by measuring them.

    When Lightning sets up the training loader (after DDP re-created it with its ``DistributedSampler``, before
    any worker starts), the loader is iterated alone (no model) at several worker counts within a
    time budget (see :func:`~lightning_gpu_boost.core.workers.tune_num_workers`: each count timed in steady state,
    at the loader's batch size or per sample where samples are slow) and the smallest count within
    ``tolerance`` of the best is applied to the loader Lightning will iterate (after DDP re-created it with its
    ``DistributedSampler``), with ``prefetch_factor`` and ``persistent_workers`` kept consistent. Under DDP every
    rank applies the same count. Results are cached on disk, keyed by the dataset and its settings, collate,
    batch size, the CPU set and processes per node, so the next run skips the probe.

    An automatic choice never leaves you worse off: where the probe cannot rank the counts within its budget, your
    ``num_workers`` stays and a warning says why; it never sets fewer workers than you had unless fewer measured
    faster.

    Logged metrics:
        ``gpu_boost/num_workers_train`` and, with ``tune_val``, ``gpu_boost/num_workers_val``: the chosen
        counts, through the Trainer's logger at step 0; plus an info line with the measured table
        (batches/s per worker count).

    Args:
        workers_budget_s: time budget of one probe in seconds, ``> 0`` (``budget_s`` before; the old name still
            works, with a deprecation warning).
        tune_val: also tune the validation loaders.
        use_cache: read and write the on-disk cache.
        cache_path: cache file (default ``~/.cache/lightning_gpu_boost/num_workers.json``).
        keep_user_value: leave loaders alone whose ``num_workers`` is already > 0 (the user pinned it).
        max_workers: upper bound of the search (default: the node's usable CPUs / its processes).
        tolerance: relative throughput difference that counts as "as good", in ``[0, 1)``.
        prefetch_factor: set when a loader goes from 0 workers to some, ``>= 1``.
        persistent_workers: keep workers between epochs when there are any.
        worker_niceness: raise the workers' nice value by this much (0 = leave it), for when the training
            process needs CPU time that busy workers would take.

    Raises:
        ValueError: a non-positive budget or prefetch factor, a tolerance outside ``[0, 1)``, negative max_workers.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[AutoNumWorkers(workers_budget_s=20)], logger=False, enable_progress_bar=False)
    """

    #: the run record's fact (:mod:`._run_facts`): this part chooses ``num_workers``
    tunes_num_workers = True


    def __init__(
        self,
        workers_budget_s: float = 30.0,
        tune_val: bool = False,
        use_cache: bool = True,
        cache_path: str | None = None,
        keep_user_value: bool = False,
        max_workers: int | None = None,
        tolerance: float = 0.03,
        prefetch_factor: int = AUTO_PREFETCH_FACTOR,
        persistent_workers: bool = AUTO_PERSISTENT_WORKERS,
        worker_niceness: int = 0,
    ) -> None:
        checks.check_number("workers_budget_s", workers_budget_s, low=0.0, low_open=True)
        checks.check_number("tolerance", tolerance, low=0.0, high=1.0, high_open=True)
        checks.check_int("max_workers", max_workers, low=0, allow_none=True)
        checks.check_int("prefetch_factor", prefetch_factor, low=1)
        checks.check_int("worker_niceness", worker_niceness, low=0, high=19)
        for name, value in (("tune_val", tune_val), ("use_cache", use_cache), ("keep_user_value", keep_user_value),
                            ("persistent_workers", persistent_workers)):  # fmt: skip
            checks.check_bool(name, value)
        checks.check_writable_file("cache_path", cache_path)
        self.workers_budget_s = workers_budget_s
        self.tune_val = tune_val
        self.use_cache = use_cache
        self.cache_path = cache_path
        self.keep_user_value = keep_user_value
        self.max_workers = max_workers
        self.tolerance = tolerance
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.worker_niceness = worker_niceness
        #: stage -> chosen worker count (restored from checkpoints)
        self.chosen: dict[str, int] = {}
        self.probes: dict[str, WorkerProbe] = {}
        self._left_alone: set[str] = set()
        self._restarts: list[Any] = []  # SpanningLoaders to start again with a new count at the epoch's end
        self._wrapped: list[Any] = []  # the resumable loaders this fit's hook made (closed at teardown)

    def _tune(self, trainer: pl.Trainer, loader: DataLoader, stage: str) -> None:
        if self.keep_user_value and loader.num_workers > 0:
            return
        fixed = fixed_worker_count(loader)
        if fixed is not None:  # the count stays the user's: said once per stage
            if stage not in self._left_alone:
                self._left_alone.add(stage)
                rank_zero_info(f"AutoNumWorkers leaves the {stage} loader at num_workers={loader.num_workers}: {fixed}.")
            return
        if stage not in self.chosen:
            probe = job_probe(
                trainer,
                loader,
                self.workers_budget_s,
                self.use_cache,
                self.cache_path,
                self.max_workers,
                self.tolerance,
            )
            self.probes[stage] = probe
            self.chosen[stage] = probe.num_workers
            source = "cache" if probe.cached else f"a {probe.elapsed_s:.1f} s probe"
            node_info(
                trainer,
                f"AutoNumWorkers: {stage} num_workers={probe.num_workers} per process (from {source}, searched up "
                f"to {probe.max_workers}: this node's {usable_cpus()} usable CPUs shared by its "
                f"{processes_per_node(trainer)} process(es)).\n{probe.format_table()}",
            )
            if not probe.conclusive:
                rank_zero_warn(f"AutoNumWorkers ({stage}): {probe.reason}")
            if trainer.logger is not None and trainer.global_rank == 0:
                trainer.logger.log_metrics({f"gpu_boost/num_workers_{stage}": probe.num_workers}, step=0)
        if stage == "train":  # the run record: the diagnosis asks this part again instead of advising a value
            run_record(trainer).choose(
                "num_workers", self.chosen[stage], by="AutoNumWorkers", why=getattr(self.probes.get(stage), "reason", "") or "measured",
                decide_again=functools.partial(self._decide_again, trainer, loader),
            )  # fmt: skip
        set_num_workers(
            loader,
            self.chosen[stage],
            self.prefetch_factor,
            self.persistent_workers,
            self.worker_niceness,
            seed_fn=lightning_worker_seed(trainer.global_rank),
        )
        facts = data_path(trainer).facts(loader)
        facts.workers_by, facts.workers_why = "AutoNumWorkers", getattr(self.probes.get(stage), "reason", "") or "measured"

    def _decide_again(self, trainer: pl.Trainer, loader: DataLoader, proposal: int, reason: str,
                      training_batches_s: float | None = None) -> tuple[int, str]:  # fmt: skip
        def apply(count: int) -> None:
            self.chosen["train"] = count
            set_num_workers(loader, count, self.prefetch_factor, self.persistent_workers, self.worker_niceness,
                            seed_fn=lightning_worker_seed(trainer.global_rank))  # fmt: skip

        facts = facts_of(trainer, loader)
        value, said = decide_workers_again(self.probes.get("train"), loader, proposal, reason, "AutoNumWorkers", apply,
                                           self.tolerance, training_batches_s, self._restarts.append,
                                           spanning=facts.spanned_by() if facts else None)  # fmt: skip
        node_info(trainer, said)
        return value, said

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a count decided again for a loader whose workers span epochs: they stop here, between two epochs, and the
        # next epoch starts them with the new count where the last one ended
        while self._restarts:
            self._restarts.pop().close()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        stages = {"train", "val"} if self.tune_val else {"train"}

        def hook(dataloader: object, loader_stage: str | None) -> object:
            # runs after Lightning injected its DistributedSampler, before any iterator exists
            if loader_stage in stages:
                for loader in iter_loaders(dataloader):
                    self._tune(trainer, loader, loader_stage)
            # a train loader resumes exactly mid-epoch (a plain DataLoader keeps no place of its own)
            if loader_stage != "train":
                return dataloader
            wrapped = resumable(dataloader)
            if wrapped is not dataloader:
                self._wrapped.append(wrapped)
            return wrapped

        add_stage(trainer, "worker_count", f"AutoNumWorkers-{id(self)}", hook)

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
        remove_stage(trainer, f"AutoNumWorkers-{id(self)}")
        remove_stage(trainer, RESUME_CHECK)
        while self._wrapped:
            self._wrapped.pop().close()


    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "chosen": dict(self.chosen), "probes": {k: p.as_dict() for k, p in self.probes.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_state_version("AutoNumWorkers", state_dict, 1)
        self.chosen = dict(state_dict.get("chosen", {}))
        self.probes = {k: WorkerProbe.from_dict(v) for k, v in state_dict.get("probes", {}).items()}
