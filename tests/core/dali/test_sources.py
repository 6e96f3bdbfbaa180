"""DALI sources (``core/dali/sources.py``): rank shares like DistributedSampler's, batch counts, pack and
folder sources read the same bytes."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import DistributedSampler

from lightning_gpu_boost.core.dali import (
    FolderSource,
    PackSource,
    num_batches,
    open_source,
    rank_indices,
)

pytest.importorskip("nvidia.dali", reason="needs the `dali` extra")


@pytest.mark.parametrize("n, world, shuffle", [(10, 1, True), (10, 3, True), (7, 4, False), (24, 2, True)])
def test_rank_indices_match_distributed_sampler(n, world, shuffle):
    for epoch in (0, 1):
        for rank in range(world):
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=3)
            sampler.set_epoch(epoch)
            assert rank_indices(n, epoch, rank, world, shuffle, seed=3) == list(sampler)


def test_num_batches_counts_the_short_last_batch_unless_dropped():
    assert num_batches(10, 4) == 3
    assert num_batches(10, 4, drop_last=True) == 2
    assert num_batches(10, 4, world_size=3) == 1  # ceil(10 / 3) = 4 samples per rank


def test_pack_source_reads_the_same_bytes(jpeg_tree, tmp_path):
    pytest.importorskip("lmdb")
    from lightning_gpu_boost.core.lmdb import pack_image_folder

    pack = pack_image_folder(jpeg_tree, tmp_path / "train.lmdb", progress=False)
    folder, packed = FolderSource(jpeg_tree), open_source(pack)
    assert isinstance(packed, PackSource) and packed.classes == folder.classes
    for i in (0, 7, 23):
        (a, la), (b, lb) = folder.read(i), packed.read(i)
        assert la == lb and np.array_equal(a, b)
