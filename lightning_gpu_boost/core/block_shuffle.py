"""Block-shuffled order for packs: records are read in large runs of consecutive keys, in an order that is still
random enough for SGD.

A pack keeps its records in key order in one file. Read in a full random order, every record is a random read,
which is what a cold cache or network storage punishes. The block order (FFCV's quasi-random order, and the
chunk-shuffled shards of litdata and WebDataset, do the same):

1. splits the records into blocks of ``block_size`` consecutive records;
2. shuffles the blocks (a new permutation every epoch);
3. gives each rank a contiguous run of that shuffled sequence (whole blocks but for the two ends), the same number
   of samples on every rank (padded by wrapping around, as ``DistributedSampler`` does, or cut with
   ``drop_last``);
4. shuffles the records inside each window of ``window_blocks`` blocks (the records a loader holds at once).

Every record comes exactly once per epoch over all ranks (but the padding), a rank reads ``window_blocks`` blocks
at a time, and a run can resume mid-epoch from :meth:`BlockShuffleSampler.state_dict`. :func:`order_stats`
measures how random an order is (label spread per batch, position correlation) against a full shuffle.
Blocks are read ahead of use, one large read each: the sampler asks for the next window's blocks as each window
starts (:attr:`BlockShuffleSampler.will_need`, :func:`read_ahead_windows`), or a reader asks for a block at its
first record (:class:`BlockReadAhead`). Framework-free: a ``torch.utils.data`` sampler, usable without a Trainer.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from lightning_gpu_boost import _checks as checks

__all__ = ['BlockReadAhead', 'BlockShuffleSampler', 'block_order', 'block_size_for', 'order_stats', 'read_ahead_windows']


def block_order(
    n: int, block_size: int, window_blocks: int, seed: int, epoch: int, rank: int = 0, num_replicas: int = 1,
    drop_last: bool = False,
) -> list[int]:  # fmt: skip
    """This rank's record indices for ``epoch`` (see the module's docstring)."""
    if n == 0:
        return []
    rng = np.random.default_rng([seed, epoch])
    blocks = rng.permutation(math.ceil(n / block_size))
    flat = (blocks[:, None] * block_size + np.arange(block_size)[None]).ravel()
    flat = flat[flat < n]  # the last block may be short
    if drop_last:
        per_rank = n // num_replicas
        flat = flat[: per_rank * num_replicas]
    else:
        per_rank = math.ceil(n / num_replicas)
        if per_rank * num_replicas > n:  # pad by wrapping around, as DistributedSampler does
            flat = np.concatenate([flat, flat[: per_rank * num_replicas - n]])
    mine = flat[rank * per_rank : (rank + 1) * per_rank]
    window = block_size * window_blocks
    if window == 1:  # blocks of one record: already a full shuffle
        return mine.tolist()
    local = np.random.default_rng([seed, epoch, rank, 1])
    out = [local.permutation(mine[s : s + window]) for s in range(0, len(mine), window)]
    return np.concatenate(out).tolist() if out else []


def read_ahead_windows(
    order: Sequence[int], block_size: int, window_blocks: int, will_need: Callable[[int, int], Any], records: int
) -> Iterator[int]:
    """Yield ``order`` (a :func:`block_order`), asking for every block of window ``k + 1`` (``will_need(lo, hi)``,
    one large read each) when window ``k`` starts, and for window 0's at once: the next window's blocks are on their
    way while this one's records are read, so a cold pass does not stop at each window's edge."""
    window = block_size * window_blocks
    failed: list[BaseException] = []

    def ask(lo: int) -> None:
        if failed:
            return
        try:
            for block in sorted({i // block_size for i in order[lo : lo + window]}):
                will_need(block * block_size, min(records, (block + 1) * block_size))
        except Exception as err:  # reading ahead only saves time: it never stops the epoch
            failed.append(err)
            warnings.warn(f"Reading blocks ahead failed ({err!r}); the epoch goes on without it.", stacklevel=2)

    if len(order):
        ask(0)
    for start in range(0, len(order), window):
        if start + window < len(order):
            ask(start + window)
        yield from order[start : start + window]


class BlockShuffleSampler(DistributedSampler):
    """Block-shuffled order over ``len(dataset)`` records, sharded by block over DDP ranks, resumable mid-epoch.

    A ``DistributedSampler`` subclass: Lightning leaves it in place under DDP (it takes the rank and world size
    from ``torch.distributed`` where initialized, else 1 process). Call :meth:`set_epoch` each epoch (Lightning
    does).

    Args:
        dataset: anything with ``len()`` (the pack's dataset).
        block_size: consecutive records per block, ``>= 1`` (:func:`block_size_for` picks it from bytes).
        window_blocks: blocks whose records are shuffled together, ``>= 1``.
        seed: the order's seed (the same on every rank).
        num_replicas: processes (default: the world size, or 1).
        rank: this process's rank (default: the global rank, or 0).
        drop_last: cut the tail so ranks get equal shares without padding.

    Raises:
        ValueError: ``block_size`` or ``window_blocks`` not an int ``>= 1``, ``seed`` not an int ``>= 0``, or a
            ``rank`` outside ``[0, num_replicas)``.

    Example::

        >>> sampler = BlockShuffleSampler(range(10), block_size=4, window_blocks=1, seed=0)
        >>> sorted(sampler) == list(range(10))
        True
    """

    def __init__(
        self,
        dataset: Any,
        block_size: int,
        window_blocks: int = 16,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ) -> None:
        checks.check_int("block_size", block_size, low=1)
        checks.check_int("window_blocks", window_blocks, low=1)
        checks.check_int("seed", seed, low=0)
        checks.check_bool("drop_last", drop_last)
        self._auto = num_replicas is None and rank is None  # the process group may start after construction
        distributed = dist.is_available() and dist.is_initialized()
        num_replicas = num_replicas if num_replicas is not None else (dist.get_world_size() if distributed else 1)
        rank = rank if rank is not None else (dist.get_rank() if distributed else 0)
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=drop_last)
        self.block_size, self.window_blocks = block_size, window_blocks
        self._start: tuple[int, int] | None = None  # (epoch, samples of it already consumed): a mid-epoch resume
        #: ``will_need(lo, hi)`` of the pack (:meth:`~lightning_gpu_boost.core.lmdb.reader.PackReader.will_need`), or
        #: ``None``: where set, iterating asks for the next window's blocks as each window starts
        #: (:func:`read_ahead_windows`); the sampler runs in the loader's main process, ahead of the workers by their
        #: queue, and the page cache it fills serves them
        self.will_need: Callable[[int, int], Any] | None = None

    def _resolve(self) -> None:
        """Take the rank and world size from the process group where it started after construction (a loader
        built before ``Trainer.fit`` initialized DDP)."""
        if not (self._auto and dist.is_available() and dist.is_initialized()):
            return
        world, rank = dist.get_world_size(), dist.get_rank()
        if (world, rank) != (self.num_replicas, self.rank):
            self.num_replicas, self.rank = world, rank
            n = len(self.dataset)
            self.num_samples = n // world if self.drop_last else math.ceil(n / world)
            self.total_size = self.num_samples * world

    def __iter__(self) -> Iterator[int]:
        self._resolve()
        order = block_order(len(self.dataset), self.block_size, self.window_blocks, self.seed, self.epoch,
                            self.rank, self.num_replicas, self.drop_last)  # fmt: skip
        start, self._start = self._start, None
        start = start[1] if start is not None and start[0] == self.epoch else 0
        if self.will_need is not None:
            return read_ahead_windows(order[start:], self.block_size, self.window_blocks, self.will_need,
                                      len(self.dataset))  # fmt: skip
        return iter(order[start:])

    def __len__(self) -> int:
        """The epoch's samples on this rank, also when resuming mid-epoch (Lightning counts the epoch's batches from
        it and resumes its own batch index where the checkpoint left it)."""
        self._resolve()
        return self.num_samples

    def start_at(self, epoch: int, samples: int) -> None:
        """Begin the next iteration ``samples`` into ``epoch``'s order, if that iteration is of ``epoch`` (the epoch
        Lightning sets after a checkpoint taken at an epoch's last batch is the next one: it starts at its beginning)."""
        self._start = (int(epoch), int(samples))

    def state_dict(self, consumed: int = 0) -> dict[str, int]:
        """Where this rank stands: the epoch and the samples of it already consumed (``consumed``: counted by the
        caller, e.g. batches handed to the step x batch size)."""
        return {"version": 1, "epoch": self.epoch, "consumed": int(consumed), "seed": self.seed, "block_size": self.block_size,
                "window_blocks": self.window_blocks, "num_replicas": self.num_replicas}  # fmt: skip

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at ``state``: the next iteration continues that epoch's order after its consumed samples."""
        from lightning_gpu_boost.core.state_version import check_state_version

        check_state_version("BlockShuffleSampler", state, 1)
        for key in ("seed", "block_size", "window_blocks", "num_replicas"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"Cannot resume a block-shuffled order with {key}={state[key]!r} on a sampler with "
                    f"{key}={getattr(self, key)!r}: the order would differ. Use the same settings and process count."
                )
        self.epoch = int(state["epoch"])
        self.start_at(self.epoch, int(state["consumed"]))


class BlockReadAhead:
    """Reads a block ahead of use: the first time a record of a block is asked for (in this process), the whole
    block is asked for in one large background read (``reader.will_need(lo, hi)``:
    :meth:`~lightning_gpu_boost.core.lmdb.reader.PackReader.will_need`), so the block's other records, which the
    window hands out soon after, come from memory instead of one disk read each. Call it with each index before
    reading the record; it remembers the last ``remember`` blocks. Cheap where the pack is in the page cache.

    Example::

        >>> class Reader:  # anything with will_need(lo, hi)
        ...     asked = []
        ...     def will_need(self, lo, hi):
        ...         self.asked.append((lo, hi))
        >>> ahead = BlockReadAhead(Reader(), block_size=4, records=10)
        >>> for i in (9, 8, 1, 2):
        ...     ahead(i)
        >>> Reader.asked
        [(8, 10), (0, 4)]
    """

    def __init__(self, reader: Any, block_size: int, records: int, remember: int = 256) -> None:
        checks.check_int("block_size", block_size, low=1)
        checks.check_int("remember", remember, low=1)
        self.reader, self.block_size, self.records, self.remember = reader, block_size, records, remember
        self._seen: dict[int, None] = {}  # insertion-ordered: the oldest block is forgotten first
        self._lock = threading.Lock()  # reading threads (DALI's feeder) share one

    def __call__(self, index: int) -> None:
        block = index // self.block_size
        if block in self._seen:
            return
        with self._lock:
            if block in self._seen:
                return
            self._seen[block] = None
            if len(self._seen) > self.remember:
                del self._seen[next(iter(self._seen))]
        lo = block * self.block_size
        self.reader.will_need(lo, min(self.records, lo + self.block_size))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_seen": {}, "_lock": None}  # each worker process asks for its own blocks

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


def block_size_for(records: int, total_bytes: int, block_bytes: int = 4 << 20) -> int:
    """Records per block so that a block holds about ``block_bytes`` (at least 1 record)."""
    if records <= 0:
        return 1
    return max(1, round(block_bytes / max(1.0, total_bytes / records)))


def order_stats(order: Sequence[int], labels: Sequence[int], batch_size: int) -> dict[str, float]:
    """How random ``order`` is: ``labels_per_batch`` (mean distinct labels in a batch), ``label_entropy`` (mean
    entropy of a batch's labels, bits) and ``position_corr`` (|Pearson correlation| between a sample's position in
    the epoch and its record index: 0 for a full shuffle, 1 for key order)."""
    idx = np.asarray(order)
    lab = np.asarray(labels)[idx]
    distinct, entropy = [], []
    for s in range(0, len(idx) - batch_size + 1, batch_size):
        _, counts = np.unique(lab[s : s + batch_size], return_counts=True)
        p = counts / counts.sum()
        distinct.append(len(counts))
        entropy.append(float(-(p * np.log2(p)).sum()))
    pos = np.arange(len(idx))
    corr = float(abs(np.corrcoef(pos, idx)[0, 1])) if len(idx) > 1 else 0.0
    return {"labels_per_batch": float(np.mean(distinct)) if distinct else 0.0,
            "label_entropy": float(np.mean(entropy)) if entropy else 0.0, "position_corr": corr}  # fmt: skip
