"""What a GPU-decode sample is on its way from a worker to the decoder, and how a batch of them is collated.

A :class:`Record` is one sample's image: the pixels its worker decoded (a CHW uint8 tensor) or a JPEG's bytes with the
operations the GPU does on it. ``default_collate`` turns a batch of them into one :class:`RecordBatch` (the collate
function is registered for the type when this module is imported, in every process that unpickles a worker's
dataset): the pixels stacked into one tensor and the JPEGs' bytes into another, a row each (padded to the longest),
both in shared memory when a worker collates, as ``default_collate`` does for tensors: the batch crosses to the
training process without a copy through a pipe, where the DataLoader's pin-memory thread pins the pixels. One row
per JPEG lets the training thread hand a batch's JPEGs to DALI as one array, not one call per JPEG. Framework-free.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils.collate import default_collate_fn_map

__all__ = ["Record", "RecordBatch", "collate_records"]


class Record:
    """One sample's image: ``pixels`` (CHW uint8, the worker decoded it) or ``jpeg`` bytes and ``ops``; ``share``:
    the GPU share its worker read when it made it (the placement's search tells old batches from new by it);
    ``geometry``: the ops as one resampling per axis (:func:`~lightning_gpu_boost.core.gpu_decode.plan.geometry`,
    flattened to 11 ints: rows' start, length, resized, offset, out, the same for the columns, flip), where the
    worker knew the image's size."""

    __slots__ = ("geometry", "jpeg", "ops", "pixels", "share")

    def __init__(self, pixels: torch.Tensor | None = None, jpeg: bytes | None = None, ops: list | None = None,
                 share: float | None = None, geometry: tuple[int, ...] | None = None) -> None:  # fmt: skip
        if (pixels is None) == (jpeg is None):
            raise ValueError("a Record holds either pixels or a JPEG")
        if geometry is not None and len(geometry) != 11:
            raise ValueError(f"a Record's geometry is 11 ints, got {geometry!r}")
        self.pixels, self.jpeg, self.ops, self.share, self.geometry = pixels, jpeg, ops or [], share, geometry

    def __getstate__(self) -> tuple:
        return self.pixels, self.jpeg, self.ops, self.share, self.geometry

    def __setstate__(self, state: tuple) -> None:
        self.pixels, self.jpeg, self.ops, self.share, self.geometry = state


def _shared(shape: tuple[int, ...]) -> torch.Tensor:
    """A uint8 tensor in shared memory where a worker collates (as ``default_collate`` allocates), else plain."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    numel = int(np.prod(shape)) if shape else 1
    storage = torch.empty(0, dtype=torch.uint8)._typed_storage()._new_shared(numel, device="cpu")
    return torch.empty(0, dtype=torch.uint8).new(storage).resize_(*shape)


class RecordBatch:
    """A batch of :class:`Record`\\ s: ``pixels`` (n, C, H, W) at the batch positions ``pixel_index``, the JPEGs' bytes
    in the rows of ``jpeg`` (``lengths`` bytes of each, the rest padding) with their ``ops`` at ``jpeg_index``;
    ``shape[0]`` is the batch's size; ``share``: the GPU share all its samples were made under (NaN where they
    differ, ``None`` where the records do not say); ``geometry``: the JPEGs' geometries, a ``(len(jpeg_index),
    11)`` int64 numpy array, where every JPEG record has one, else ``None``; ``made_at``: when it was collated
    (``time.monotonic()``, one clock for every process of the machine: the placement's search reads how fast the
    workers make batches from it) and ``made_by``: by which worker (``-1``: the training process)."""

    def __init__(self, size: int, pixels: torch.Tensor | None, pixel_index: list[int], jpeg: torch.Tensor | None,
                 lengths: list[int], ops: list[list], jpeg_index: list[int], share: float | None = None,
                 geometry: np.ndarray | None = None, made_at: float | None = None,
                 made_by: int | None = None) -> None:  # fmt: skip
        self.size, self.pixels, self.pixel_index, self.share = size, pixels, pixel_index, share
        self.jpeg, self.lengths, self.ops, self.jpeg_index = jpeg, lengths, ops, jpeg_index
        self.geometry, self.made_at, self.made_by = geometry, made_at, made_by

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    def __len__(self) -> int:
        return self.size

    def jpegs(self) -> list[torch.Tensor]:
        """Each JPEG's bytes, a view of its row of :attr:`jpeg`."""
        if self.jpeg is None:
            return []
        return [self.jpeg[k, :n] for k, n in enumerate(self.lengths)]

    def pin_memory(self, device: Any = None) -> RecordBatch:
        """The pixels pinned (the DataLoader's pin-memory thread calls it; they are copied to the GPU); the JPEGs'
        bytes stay where they are: the decoders read them on the CPU (on the H200 DALI fed from pageable rows ran as
        fast as from pinned ones), and pinning them was a copy of every batch's bytes."""
        pixels = self.pixels.pin_memory() if self.pixels is not None else None
        return RecordBatch(self.size, pixels, self.pixel_index, self.jpeg, self.lengths, self.ops,
                           self.jpeg_index, self.share, self.geometry, self.made_at, self.made_by)  # fmt: skip

    def __repr__(self) -> str:
        return f"RecordBatch({self.size} samples: {len(self.jpeg_index)} JPEGs, {len(self.pixel_index)} decoded)"


def collate_records(batch: list[Record], *, collate_fn_map: Any = None) -> RecordBatch:
    """``default_collate``'s function for :class:`Record`\\ s: one :class:`RecordBatch`."""
    pixels = [(k, r.pixels) for k, r in enumerate(batch) if r.pixels is not None]
    jpegs = [(k, r) for k, r in enumerate(batch) if r.jpeg is not None]
    stacked = None
    if pixels:
        stacked = _shared((len(pixels), *pixels[0][1].shape))
        torch.stack([p for _, p in pixels], out=stacked)
    rows, lengths = None, [len(r.jpeg) for _, r in jpegs]
    if jpegs:
        rows = _shared((len(jpegs), max(lengths)))
        view = rows.numpy()
        for k, (_, r) in enumerate(jpegs):
            view[k, : lengths[k]] = np.frombuffer(r.jpeg, dtype=np.uint8)
    shares = {r.share for r in batch}
    worker = get_worker_info()
    geometry = None
    if jpegs and all(r.geometry is not None for _, r in jpegs):  # numpy: pickled by value (a tensor from a worker is
        # shared memory whose descriptor the pin-memory thread fetches: ResNet-18 on the H200 trained 0.75 of the
        # ceiling with the geometry a tensor, 0.79 with it an array)
        geometry = np.array([r.geometry for _, r in jpegs], dtype=np.int64)
    return RecordBatch(len(batch), stacked, [k for k, _ in pixels], rows, lengths, [r.ops for _, r in jpegs],
                       [k for k, _ in jpegs], shares.pop() if len(shares) == 1 else math.nan, geometry,
                       time.monotonic(), -1 if worker is None else worker.id)  # fmt: skip


default_collate_fn_map[Record] = collate_records
