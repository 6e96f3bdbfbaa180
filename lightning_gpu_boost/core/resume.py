"""Exact resume: a loader that saves where its epoch stands and starts its next iteration there.

A checkpoint records the training loop's place (epoch ``e``, ``k`` batches done); a loader that can say where its
epoch stands lets the resumed run hand the step exactly the batches the uninterrupted run would have handed it next.
:class:`ResumableDataLoader` is a ``DataLoader`` whose ``state_dict()`` is ``{"epoch": e, "batches": k}`` (the
sampler's epoch and the batches of it handed out) and whose next iteration after ``load_state_dict()`` skips the
first ``k`` index batches of epoch ``e`` without loading them. It starts at the epoch's beginning instead where the
saved place does not apply: the epoch the loop asks for is not ``e`` (a checkpoint saved at an epoch's last batch:
the loop goes on with the next epoch), or ``k`` is the whole epoch.

The skip is exact for a sampler whose order is a function of its epoch (``DistributedSampler``, the package's
``BlockShuffleSampler``, a ``SequentialSampler``); a sampler that draws a new order at each iteration from the
global random state (``RandomSampler`` without a generator) cannot be resumed exactly by anyone: the loader says so
once. A sampler with ``start_at(epoch, samples)`` (``BlockShuffleSampler``) skips by itself, so its read-ahead never
reads the blocks of the skipped part. Framework-free: Lightning calls ``state_dict`` / ``load_state_dict`` from its
loop state, any other loop can call them too.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, RandomSampler

from lightning_gpu_boost.core.epoch_order import inner_sampler, start_index_sampler

__all__ = ["PLACE_VERSION", "ResumableDataLoader", "SkipFirst", "check_place", "loader_settings",
           "resume_start", "sampler_epoch"]

#: the version of the place a resumable loader saves (``{"version", "epoch", "batches", "settings", ...}``)
PLACE_VERSION = 1


def loader_settings(batch_size: int | None, drop_last: bool, index_sampler: Any) -> dict[str, Any]:
    """What a saved place in an epoch depends on: the batch size, the sampler's kind, length and settings (its
    process count, seed and blocks where it has them). A resume with other values would skip another part of
    another order."""
    sampler = inner_sampler(index_sampler)
    settings: dict[str, Any] = {"batch_size": batch_size, "drop_last": bool(drop_last),
                                "sampler": type(sampler).__name__}  # fmt: skip
    for key, obj in (("samples", sampler), ("batches", index_sampler)):
        try:
            settings[key] = len(obj)
        except TypeError:
            pass
    for key in ("num_replicas", "seed", "block_size", "window_blocks"):
        value = getattr(sampler, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            settings[key] = value
    return settings


def check_place(state: dict[str, Any], settings: dict[str, Any], what: str = "train loader") -> None:
    """Refuse, in one line naming the setting and both values, a saved place whose settings differ from
    ``settings`` (this run's), or a place of a newer format. A place without a version (saved before places
    recorded their settings) is taken as it is."""
    from lightning_gpu_boost.core.state_version import check_state_version

    check_state_version(f"The {what}", state, PLACE_VERSION)
    for key, was in (state.get("settings") or {}).items():
        if key in settings and settings[key] != was:
            raise ValueError(
                f"Cannot resume the {what} where the checkpoint left it: it was saved with {key}={was!r} and this run "
                f"has {key}={settings[key]!r}, so its place would fall elsewhere in another order. Resume with "
                f"{key}={was!r}, or start a new fit from the weights alone."
            )


def sampler_epoch(sampler: Any) -> int | None:
    """The epoch ``sampler`` was set to (``set_epoch``), or ``None`` where it has none."""
    epoch = getattr(sampler, "epoch", None)
    return int(epoch) if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def resume_start(saved: dict[str, Any] | None, epoch: int | None, length: int | None) -> int:
    """The batches of the coming epoch (``epoch``, ``length`` batches) to skip, from a loader's saved place: ``k``
    where the place is ``k`` batches into this very epoch, else 0 (another epoch, a finished one, or none)."""
    if not saved:
        return 0
    k = int(saved.get("batches", 0))
    if saved.get("epoch") != epoch or k <= 0 or (length is not None and k >= length):
        return 0
    return k


class SkipFirst:
    """An index sampler (a batch sampler, or a sampler) whose next iteration skips its first :attr:`pending`
    items without anyone loading them; later iterations are the sampler's own. ``len()`` is the sampler's.

    Example::

        >>> from torch.utils.data import BatchSampler, SequentialSampler
        >>> batches = SkipFirst(BatchSampler(SequentialSampler(range(6)), 2, False))
        >>> batches.pending = 2
        >>> list(batches), list(batches)
        ([[4, 5]], [[0, 1], [2, 3], [4, 5]])
    """

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.pending = 0

    def __iter__(self) -> Iterator[Any]:
        skip, self.pending = self.pending, 0
        it = iter(self.sampler)
        for _ in range(skip):
            if next(it, StopIteration) is StopIteration:
                return
        yield from it

    def __len__(self) -> int:
        return len(self.sampler)


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` that resumes exactly mid-epoch (see the module's docstring): ``state_dict()`` says where
    the epoch stands, and after ``load_state_dict()`` the next iteration continues the same epoch's order after the
    batches already handed out, loading none of them again. Lightning saves and restores the state with its loops'.

    Example::

        >>> loader = ResumableDataLoader(list(range(8)), batch_size=2)
        >>> it = iter(loader); _ = next(it); _ = next(it)
        >>> state = loader.state_dict(); state["epoch"], state["batches"]
        (None, 2)
        >>> resumed = ResumableDataLoader(list(range(8)), batch_size=2)
        >>> resumed.load_state_dict(state)
        >>> [b.tolist() for b in resumed]
        [[4, 5], [6, 7]]
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._place: tuple[int | None, int] = (None, 0)  # (epoch, batches of it handed out)
        self._saved: dict[str, Any] | None = None  # a place to start the next iteration at
        self._skipper: SkipFirst | None = None
        self._warned = False

    @property
    def _index_sampler(self) -> Any:  # the iterators read it once: SkipFirst lets each iteration skip its start
        base = self.batch_sampler if self._auto_collation else self.sampler
        if getattr(self, "_skipper", None) is None or self._skipper.sampler is not base:
            self._skipper = SkipFirst(base)
        return self._skipper

    def _epoch(self) -> int | None:
        return sampler_epoch(self.sampler)

    def _length(self) -> int | None:
        try:
            return len(self)
        except TypeError:
            return None

    def _take_saved(self) -> tuple[dict[str, Any] | None, int | None]:
        """The loaded place, taken once (``None`` where it does not apply to the coming epoch), and that epoch."""
        saved, self._saved = self._saved, None
        epoch = self._epoch()
        if saved and isinstance(self.dataset, IterableDataset):  # its stream is its own: no index to skip to
            if resume_start(saved, epoch, self._length()):
                warnings.warn(
                    f"Resuming {saved['batches']} batches into epoch {epoch} of an IterableDataset: its stream cannot "
                    "be started where the checkpoint was, so this epoch restarts at its beginning (samples of it "
                    "are seen again). Save and restore the dataset's own state for an exact resume.",
                    stacklevel=3,
                )
            return None, epoch
        return (saved if resume_start(saved, epoch, self._length()) else None), epoch

    def _skip(self, epoch: int | None, batches: int) -> None:
        """Make the next iteration skip the first ``batches`` index batches of ``epoch`` without loading them."""
        if batches and not self._warned and isinstance(self.sampler, RandomSampler) and self.sampler.generator is None:
            self._warned = True
            warnings.warn(
                "This DataLoader shuffles with a RandomSampler that draws a new order at every iteration: the resumed "
                "epoch skips as many batches as were done, but of another order. Give it a seeded generator or use "
                "a DistributedSampler or BlockShuffleSampler for an exact resume.",
                stacklevel=3,
            )
        if batches and not start_index_sampler(self._index_sampler.sampler, self.batch_size, epoch, batches):
            self._index_sampler.pending = batches

    def __iter__(self) -> Iterator[Any]:
        saved, epoch = self._take_saved()
        start = int(saved["batches"]) if saved else 0
        self._skip(epoch, start)
        self._place = (epoch, start)
        for batch in super().__iter__():
            self._place = (epoch, self._place[1] + 1)
            yield batch

    def _settings(self) -> dict[str, Any]:
        index = self.batch_sampler if self._auto_collation else self.sampler
        return loader_settings(self.batch_size, self.drop_last, index)

    def state_dict(self) -> dict[str, Any]:
        """``{"version", "epoch": e, "batches": k, "settings"}``: ``k`` batches of epoch ``e`` handed out, and what
        that place depends on (:func:`loader_settings`)."""
        return {"version": PLACE_VERSION, "epoch": self._place[0], "batches": self._place[1],
                "settings": self._settings()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start the next iteration at ``state`` (where it applies: see the module's docstring).

        Raises:
            ValueError: ``state`` was saved with other settings (:func:`check_place`)."""
        if state:
            check_place(state, self._settings())
            self._saved = dict(state)


def gather_ranks(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` of every DDP rank, for a loader whose place differs between ranks (Lightning saves the checkpoint
    of rank 0 alone, and collects every rank's loop state for it: this is called on every rank). One process:
    ``state`` itself."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return state
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, state)
    return {"ranks": states}


def own_rank(state: dict[str, Any]) -> dict[str, Any]:
    """This rank's part of a :func:`gather_ranks` state (``state`` itself where it holds one process's)."""
    if "ranks" not in state:
        return state
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    ranks = state["ranks"]
    if rank >= len(ranks):
        raise ValueError(
            f"The checkpoint's loader state holds {len(ranks)} processes' places and this is rank {rank}: resume "
            "with the process count that saved it."
        )
    return ranks[rank]


def saved_worker_count(state: Any) -> int | None:
    """The worker count a torchdata ``StatefulDataLoader`` state was saved with (its state is per worker), or
    ``None`` for any other state."""
    if not isinstance(state, dict):
        return None
    snapshot = state.get("_snapshot")
    if isinstance(snapshot, dict) and isinstance(snapshot.get("_worker_snapshots"), dict):
        return len(snapshot["_worker_snapshots"])
    if "_sampler_iter_state" in state and "_num_yielded" in state:  # its state without workers
        return 0
    return None


def refuse_other_worker_count(loader: Any, state: Any) -> None:
    """Raise one line where ``loader`` (a ``StatefulDataLoader``) is to resume ``state`` saved with another worker
    count: torchdata keeps one place per worker and cannot map them onto another count (it raises a message about
    ``iter(combined_loader)`` otherwise)."""
    saved = saved_worker_count(state)
    now = getattr(loader, "num_workers", None)
    if saved is None or now is None or type(loader).__name__ != "StatefulDataLoader" or saved == now:
        return
    raise ValueError(
        f"Cannot resume the train loader's place: its StatefulDataLoader saved it with num_workers={saved} and this "
        f"run has num_workers={now} (torchdata keeps one place per worker). Resume with num_workers={saved}, or start "
        "a new run."
    )
