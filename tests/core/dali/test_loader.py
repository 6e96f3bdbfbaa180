"""DALILoader (``core/dali/loader.py``) on real DALI CPU pipelines (device_id=None): exact epochs, early
stops, shards, several pipelines, block order."""

from __future__ import annotations

import functools
import pickle

import pytest
import torch

from lightning_gpu_boost.core.dali import (
    DALILoader,
    classification_graph,
    num_batches,
    open_source,
    rank_indices,
)

pytest.importorskip("nvidia.dali", reason="needs the `dali` extra")
from tests.core.dali.shared import loader


def test_short_last_batch_and_exactly_once_per_epoch(jpeg_tree):
    dl = loader(jpeg_tree, batch_size=5)
    assert dl.reads_in_dali  # a folder: Python sends paths, DALI's threads read the files
    assert len(dl) == 5
    for _ in range(3):
        batches = list(dl)
        assert [len(labels) for _, labels in batches] == [5, 5, 5, 5, 4]
        ids = sum((labels.tolist() for _, labels in batches), [])
        assert sorted(ids) == list(range(24))
    images, labels = batches[0]
    assert images.shape == (5, 3, 16, 16) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and labels.ndim == 1


def test_each_epoch_reshuffles_and_set_epoch_replays_an_order(jpeg_tree):
    dl = loader(jpeg_tree, batch_size=24)
    first, second = (next(iter(dl))[1].tolist() for _ in range(2))  # each iteration is a new epoch
    assert first != second and sorted(first) == sorted(second)
    dl.set_epoch(0)
    assert next(iter(dl))[1].tolist() == first == rank_indices(24, 0)


def test_an_epoch_stopped_early_does_not_shift_the_next(jpeg_tree):
    dl = loader(jpeg_tree, batch_size=4, prefetch_queue_depth=3)
    it = iter(dl)
    got = [next(it)[1].tolist() for _ in range(2)]
    assert sum(got, []) == rank_indices(24, 0)[:8]
    full = [labels.tolist() for _, labels in dl]  # epoch 1 starts at its own beginning
    assert sum(full, []) == rank_indices(24, 1)
    assert dl.discarded >= 1  # what DALI had computed ahead for epoch 0 was thrown away


def test_ranks_split_an_epoch_disjointly_with_equal_steps(jpeg_tree):
    shards = [[labels.tolist() for _, labels in loader(jpeg_tree, batch_size=3, rank=r, world_size=5)]
              for r in range(5)]  # fmt: skip
    assert {len(s) for s in shards} == {2}  # ceil(24 / 5) = 5 samples per rank: batches of 3 and 2
    ids = sum((sum(s, []) for s in shards), [])
    assert set(ids) == set(range(24)) and len(ids) == 25  # one sample padded, like DistributedSampler


def test_drop_last(jpeg_tree):
    dl = loader(jpeg_tree, batch_size=5, drop_last=True)
    assert len(dl) == 4 and [len(labels) for _, labels in dl] == [5, 5, 5, 5]


def test_errors(jpeg_tree, tmp_path):
    with pytest.raises(FileNotFoundError, match="No image folder or LMDB pack"):
        open_source(tmp_path / "missing")
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        loader(jpeg_tree, batch_size=0)
    with pytest.raises(ValueError, match="dtype must be one of"):
        loader(jpeg_tree, dtype="int4")
    with pytest.raises(ValueError, match="rank must be in"):
        loader(jpeg_tree, rank=2, world_size=2)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(loader(jpeg_tree))


def test_whole_epochs_flow_across_boundaries_without_discarding(jpeg_tree):
    dl = loader(jpeg_tree, batch_size=5)
    for epoch in range(3):
        assert sum((labels.tolist() for _, labels in dl), []) == rank_indices(24, epoch)
    assert dl.discarded == 0  # the next epoch was read and decoded ahead, and it was the one asked for


@pytest.mark.parametrize("depth", [3, 4])
@pytest.mark.parametrize("batch_size", [24, 12])
def test_epochs_shorter_than_the_prefetch_queue(jpeg_tree, depth, batch_size):
    # one or two batches per epoch, while DALI's first run asks for `depth` batches at once
    dl = loader(jpeg_tree, batch_size=batch_size, prefetch_queue_depth=depth)
    for epoch in range(4):
        assert sum((labels.tolist() for _, labels in dl), []) == rank_indices(24, epoch)
    assert dl.discarded == 0
    dl.close()


def test_without_the_producer_thread_epochs_stay_exact(jpeg_tree):
    dl = loader(jpeg_tree, batch_size=5, pipelines=2)
    dl._threaded = False  # the training loop runs the pipelines itself (benchmarks/diagnostics/dali_loop.py threaded=0)
    assert sum((labels.tolist() for _, labels in dl), []) == rank_indices(24, 0)
    it = iter(dl)
    assert next(it)[1].tolist() == rank_indices(24, 1)[:5]  # stopped early: the rest of the epoch is discarded
    assert sum((labels.tolist() for _, labels in dl), []) == rank_indices(24, 2)
    dl.close()


@pytest.mark.parametrize("pipelines", [2, 3])
def test_several_pipelines_keep_the_order_exact_epochs_and_early_stops(jpeg_tree, pipelines):
    dl = loader(jpeg_tree, batch_size=5, pipelines=pipelines)
    assert len(dl._build()) == pipelines
    for epoch in range(2):  # 5 batches: an odd count, so epochs end on different pipelines
        batches = [labels.tolist() for _, labels in dl]
        assert [len(b) for b in batches] == [5, 5, 5, 5, 4]
        assert sum(batches, []) == rank_indices(24, epoch)
    it = iter(dl)
    assert sum((next(it)[1].tolist() for _ in range(3)), []) == rank_indices(24, 2)[:15]  # stopped early
    assert sum((labels.tolist() for _, labels in dl), []) == rank_indices(24, 3)
    dl.close()


def test_block_order_reads_a_pack_in_runs_of_records_exactly_once_per_epoch(jpeg_tree, tmp_path):
    pytest.importorskip("lmdb")
    from lightning_gpu_boost.core.block_shuffle import BlockReadAhead, block_order
    from lightning_gpu_boost.core.lmdb import pack_image_folder

    pack = pack_image_folder(jpeg_tree, tmp_path / "train.lmdb", progress=False)
    graph = functools.partial(classification_graph, train=True, gpu=False, image_size=16)
    source = open_source(pack)
    dl = DALILoader(source, graph, 4, num_threads=1, read_threads=2, order="block", block_size=3, window_blocks=2)
    assert isinstance(source.read_ahead, BlockReadAhead) and source.read_ahead.block_size == 3
    assert sum(dl.epoch_batches(0), []) == block_order(len(source), 3, 2, seed=0, epoch=0)
    assert sum(len(labels) for _, labels in dl) == len(source)
    ids = loader(jpeg_tree, order="block", block_size=3, window_blocks=1, rank=1, world_size=2)
    seen = [int(i) for _, labels in ids for i in labels]
    assert seen == block_order(len(source), 3, 1, seed=0, epoch=0, rank=1, num_replicas=2)
    assert len(ids) == num_batches(len(source), 4, world_size=2)
    dl.close(), ids.close()
    with pytest.raises(ValueError, match="order"):
        loader(jpeg_tree, order="blocks")
