"""What a DALI pipeline reads: the rank's indices of an epoch (:func:`rank_indices`), sample sources (a class-per-folder
tree, a file list, an LMDB pack) and the feeder that reads their bytes ahead in threads for ``fn.external_source``."""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
import torch

from lightning_gpu_boost.core.images import scan_image_folder

__all__ = ['DTYPES', 'Dtype', 'FileListSource', 'FolderSource', 'PackSource', 'num_batches', 'open_source', 'rank_indices']

Dtype = Literal["float32", "float16", "bfloat16", "uint8"]
DTYPES = ("float32", "float16", "bfloat16", "uint8")


def rank_indices(
    n: int, epoch: int, rank: int = 0, world_size: int = 1, shuffle: bool = True, seed: int = 0
) -> list[int]:
    """The sample indices of one rank for one epoch, as torch's ``DistributedSampler`` picks them: one permutation
    seeded by ``seed + epoch`` (or the natural order), padded with its own first indices to a multiple of
    ``world_size``, then every ``world_size``-th index from ``rank``. Every rank gets ``ceil(n / world_size)``."""
    if n < 1:
        raise ValueError(f"A source needs at least one sample, got {n}.")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}.")
    if shuffle:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    else:
        order = list(range(n))
    per_rank = math.ceil(n / world_size)
    pad = per_rank * world_size - n
    order += (order * math.ceil(pad / n))[:pad]
    return order[rank::world_size]


def num_batches(n: int, batch_size: int, world_size: int = 1, drop_last: bool = False) -> int:
    """Batches per epoch of each rank (see :func:`rank_indices`)."""
    per_rank = math.ceil(n / world_size)
    return per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)


_CHECK_IMAGE = object()  # a source without ``check``: bad_samples.check_image (imported when a batch is read)


class _ListedFiles:
    """Files listed in ``samples`` (``(path, label)`` pairs), read as ``(uint8 array, label)`` or named to DALI."""

    samples: list[tuple[str, int]]
    #: what Python checks in the bytes it reads (``bad_samples="skip"``): images' structure, or the source's own
    #: callable (``None``: nothing)
    check: Any = _CHECK_IMAGE
    _encoded: list[np.ndarray] | None = None  # the paths as UTF-8 arrays, made on first use

    def __len__(self) -> int:
        return len(self.samples)

    def read(self, index: int) -> tuple[np.ndarray, int]:
        path, label = self.samples[index]
        return np.fromfile(path, dtype=np.uint8), label

    def sample_path(self, index: int) -> str:
        return self.samples[index][0]

    def path(self, index: int) -> tuple[np.ndarray, int]:
        """The file's path as UTF-8 bytes (for DALI's ``fn.io.file.read``) and its label."""
        if self._encoded is None:
            self._encoded = [np.frombuffer(p.encode("utf-8"), dtype=np.uint8) for p, _ in self.samples]
        return self._encoded[index], self.samples[index][1]


class FolderSource(_ListedFiles):
    """Encoded images of a class-per-folder tree (``root/<class>/<image>``), read as ``(uint8 array, label)``."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = str(root)
        self.samples, self.classes, self.ignored_files = scan_image_folder(root)


class FileListSource(_ListedFiles):
    """Files of any kind named in a list, each with its label (e.g. audio clips for :func:`audio_graph`), read by
    DALI's threads. Python checks nothing in them (``check = None``): a file DALI cannot decode stops its decoder.

    Args:
        paths: the files.
        labels: one ``int`` label per file.

    Raises:
        ValueError: no files, or not one label per file.
        FileNotFoundError: a file that does not exist.
    """

    check = None  # no structure check in Python for bytes read here (bad_samples="skip"): any file kind

    def __init__(self, paths: Sequence[str | os.PathLike], labels: Sequence[int]) -> None:
        self.samples = [(str(p), int(label)) for p, label in zip(paths, labels, strict=False)]
        if not self.samples or len(paths) != len(labels):
            raise ValueError(f"FileListSource needs one label per file and at least one file, got {len(paths)} "
                             f"paths and {len(labels)} labels.")  # fmt: skip
        missing = next((p for p, _ in self.samples if not os.path.isfile(p)), None)
        if missing is not None:
            raise FileNotFoundError(f"FileListSource: no file at {missing!r}.")
        self.root = os.path.commonpath([p for p, _ in self.samples]) if len(self.samples) > 1 else self.samples[0][0]
        self.classes = sorted({label for _, label in self.samples})


class PackSource:
    """Encoded images of an LMDB image pack (a pack file or a shard manifest), opened lazily in each process."""

    def __init__(self, path: str | os.PathLike, check_crc: bool = True) -> None:
        from lightning_gpu_boost.core.lmdb import open_pack

        self.root = str(path)
        self.reader = open_pack(path, check_crc=check_crc)
        if self.reader.meta("kind") != "image_folder":
            raise ValueError(
                f"{self.root!r} holds {self.reader.meta('kind')!r} samples, not an image folder pack."
            )
        self.classes = self.reader.meta("classes")
        self.ignored_files = self.reader.meta("ignored_files") or 0
        #: called with each index before its record is read (set by ``DALILoader(order="block")``)
        self.read_ahead: Callable[[int], None] | None = None

    def __len__(self) -> int:
        return len(self.reader)

    def read(self, index: int) -> tuple[np.ndarray, int]:
        if self.read_ahead is not None:
            self.read_ahead(index)
        return self.reader.read(index, lambda r: (np.frombuffer(bytes(r.payload), dtype=np.uint8), r.label))

    def sample_path(self, index: int) -> str:
        return self.reader.source_path(index)


def open_source(path: str | os.PathLike, check_crc: bool = True) -> FolderSource | PackSource:
    """A :class:`FolderSource` for a directory, a :class:`PackSource` for an LMDB pack file or shard manifest."""
    if os.path.isdir(path):
        return FolderSource(path)
    if os.path.exists(path) or os.path.exists(f"{path}.partial"):
        return PackSource(path, check_crc=check_crc)
    raise FileNotFoundError(
        f"No image folder or LMDB pack at {str(path)!r}: expected a class-per-folder tree or a file written by "
        "`lightning-gpu-boost pack`."
    )


class _Feeder:
    """The ``external_source`` batch callable: returns the encoded images and labels of the planned batches in
    order (read ahead by a thread pool) and raises ``StopIteration`` when the plan is used up."""

    def __init__(
        self, source: Any, read_threads: int, read_ahead: int, keep: int, paths: bool = False,
        bad_samples: str = "raise", tracker: Any = None,
    ) -> None:  # fmt: skip
        self.source = source
        self._get = source.path if paths else source.read  # paths: DALI's threads read the files
        self._paths = paths
        #: bytes read here are checked (the source's ``check``, default :func:`check_image`: structure) so that
        #: DALI never sees a broken file; a source with ``check = None`` is not checked
        self._check = None if paths else getattr(source, "check", _CHECK_IMAGE)
        self.bad_samples, self.tracker = bad_samples, tracker
        self.read_threads = read_threads
        self.read_ahead = read_ahead
        self._plan: deque[tuple[int, list[int]]] = deque()
        self._pending: deque[Future] = deque()
        self._pool: ThreadPoolExecutor | None = None
        self._keep: deque[Any] = deque(maxlen=keep)

    def _read_batch(self, epoch: int, indices: list[int]) -> tuple[list[np.ndarray] | np.ndarray, np.ndarray]:
        from lightning_gpu_boost.core.bad_samples import (
            BadSampleError,
            bad_sample_error,
            check_image,
            describe,
        )
        from lightning_gpu_boost.core.lmdb import CorruptRecordError

        items, bad = [], []
        check = check_image if self._check is _CHECK_IMAGE else self._check
        for i in indices:
            try:
                item = self._get(i)
                problem = check(memoryview(item[0])) if check is not None else None
            except (OSError, CorruptRecordError) as err:
                problem = str(err)
            if problem is None:
                items.append(item)
                continue
            if self.bad_samples == "raise":
                raise bad_sample_error(i, self.source.sample_path(i), self.source.root, problem)
            self.tracker.mark(i, epoch)  # dropped from this batch; DALILoader refills the batch
            bad.append(i)
        if not items:
            raise BadSampleError(
                f"Every sample of a batch is bad ({describe([self.source.sample_path(i) for i in bad[:5]], len(bad))});"
                " remove or repack the broken files."
            )
        labels = np.array([label for _, label in items], dtype=np.int64)
        if self._paths:
            # paths: one dense array, NUL-padded (DALI reads each row as a C string): DALI takes a dense batch in
            # one piece, where a list costs a conversion per sample in the feeding thread (H100 machine: 1.2 ms of
            # Python per 32-sample batch fed, beside a training thread that needs the same interpreter)
            dense = np.zeros((len(items), max(len(data) for data, _ in items) + 1), dtype=np.uint8)
            for k, (data, _) in enumerate(items):
                dense[k, : len(data)] = data
            return dense, labels
        return [data for data, _ in items], labels

    def _fill(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.read_threads, thread_name_prefix="dali-read")
        while self._plan and len(self._pending) < self.read_ahead:
            self._pending.append(self._pool.submit(self._read_batch, *self._plan.popleft()))

    def extend(self, batches: list[tuple[int, list[int]]]) -> None:
        """Plan ``batches`` (``(epoch, indices)``) after those already planned."""
        self._plan.extend(batches)
        self._fill()

    def planned(self) -> int:
        """Batches planned that DALI has not asked for yet."""
        return len(self._pending) + len(self._plan)

    def stop(self) -> None:
        """Forget the rest of the plan: the next call raises ``StopIteration``."""
        self._plan.clear()
        for future in self._pending:
            future.cancel()
        self._pending.clear()

    def __call__(self, batch_info: Any = None) -> tuple[list[np.ndarray], np.ndarray]:
        if not self._pending:
            raise StopIteration
        future = self._pending.popleft()
        self._fill()
        batch = future.result()
        self._keep.append(batch)  # DALI uses these arrays in place (no_copy): keep them alive until consumed
        return batch

    def close(self) -> None:
        self.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
