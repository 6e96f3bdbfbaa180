"""DALILoader on real DALI CPU pipelines (device_id=None): exact epochs, early stops, shards, dtypes, layouts."""

from __future__ import annotations

import functools
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from lightning_gpu_boost.core.dali import (
    DALILoader,
    FileListSource,
    FolderSource,
    PackSource,
    audio_graph,
    classification_graph,
    num_batches,
    open_source,
    rank_indices,
)
from tests.helpers import IdSource

pytest.importorskip("nvidia.dali", reason="needs the `dali` extra")


def loader(
    root, batch_size=4, train=True, dtype="float32", channels_last=False, normalize="imagenet", **kwargs
):
    extra = {} if normalize == "imagenet" else {"normalize": normalize}
    graph = functools.partial(
        classification_graph, train=train, gpu=False, image_size=16, dtype=dtype, channels_last=channels_last,
        **extra,
    )  # fmt: skip
    return DALILoader(
        IdSource(FolderSource(root)), graph, batch_size, num_threads=1, read_threads=2, dtype=dtype,
        channels_last=channels_last, **kwargs,
    )  # fmt: skip


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


@pytest.mark.parametrize(
    "dtype, channels_last, normalize, expected",
    [("float16", False, "imagenet", torch.float16), ("bfloat16", True, "imagenet", torch.bfloat16),
     ("uint8", True, None, torch.uint8)],
)  # fmt: skip
def test_dtypes_and_channels_last(jpeg_tree, dtype, channels_last, normalize, expected):
    images, _ = next(
        iter(loader(jpeg_tree, train=False, dtype=dtype, channels_last=channels_last, normalize=normalize))
    )
    assert images.dtype == expected and images.shape == (4, 3, 16, 16)
    assert images.is_contiguous(memory_format=torch.channels_last) == channels_last
    if dtype == "uint8":
        assert images.max() > 1  # 0-255 pixels


def test_validation_graph_is_deterministic(jpeg_tree):
    dl = loader(jpeg_tree, train=False, shuffle=False, batch_size=8)
    a, b = next(iter(dl))[0], next(iter(dl))[0]
    assert torch.equal(a, b)
    assert abs(float(a.mean())) < 2  # normalized


def test_pack_source_reads_the_same_bytes(jpeg_tree, tmp_path):
    pytest.importorskip("lmdb")
    from lightning_gpu_boost.core.lmdb import pack_image_folder

    pack = pack_image_folder(jpeg_tree, tmp_path / "train.lmdb", progress=False)
    folder, packed = FolderSource(jpeg_tree), open_source(pack)
    assert isinstance(packed, PackSource) and packed.classes == folder.classes
    for i in (0, 7, 23):
        (a, la), (b, lb) = folder.read(i), packed.read(i)
        assert la == lb and np.array_equal(a, b)


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


def _wav(path, samples):
    import wave

    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16_000)
        f.writeframes(samples.astype("<i2").tobytes())


@pytest.fixture
def wav_clips(tmp_path):
    rng = np.random.default_rng(0)
    clips = [rng.integers(-3000, 3000, int(n)).astype(np.int16) for n in rng.integers(800, 2400, 10)]
    paths = []
    for k, clip in enumerate(clips):
        paths.append(tmp_path / f"clip_{k}.wav")
        _wav(paths[-1], clip)
    return paths, clips


def test_audio_graph_yields_padded_waveforms_lengths_and_labels_exactly_once(wav_clips):
    paths, clips = wav_clips
    dl = DALILoader(FileListSource(paths, list(range(10))), functools.partial(audio_graph, gpu=False), 4,
                    num_threads=1, read_threads=2)  # fmt: skip
    assert dl.reads_in_dali and len(dl) == 3
    for _ in range(2):
        batches = list(dl)
        assert sorted(sum((labels.tolist() for *_, labels in batches), [])) == list(range(10))
    for waves, lengths, labels in batches:
        assert waves.dtype == torch.int16 and waves.shape == (len(labels), int(lengths.max()))
        for wave, n, label in zip(waves, lengths.tolist(), labels.tolist(), strict=True):
            assert n == len(clips[label]) and torch.equal(wave[:n], torch.from_numpy(clips[label]))
            assert not wave[n:].any()  # zeros after the clip
    with pytest.raises(ValueError, match="one label per file"):
        FileListSource(paths, [0])
    with pytest.raises(FileNotFoundError, match="no file at"):
        FileListSource([paths[0].parent / "missing.wav"], [0])
    with pytest.raises(ValueError, match="dtype must be 'int16' or 'float32'"):
        audio_graph(None, gpu=False, dtype="int8")


def test_audio_graph_skips_no_audio_as_a_broken_image(wav_clips):
    # bad_samples="skip" makes Python read and check the bytes: a FileListSource checks nothing (no image rules)
    paths, clips = wav_clips
    dl = DALILoader(FileListSource(paths, list(range(10))), functools.partial(audio_graph, gpu=False, dtype="float32"),
                    5, num_threads=1, read_threads=2, bad_samples="skip")  # fmt: skip
    assert not dl.reads_in_dali
    waves, lengths, labels = next(iter(dl))
    assert waves.dtype == torch.float32 and len(labels) == 5
    k = int(labels[0])
    assert torch.allclose(waves[0, : lengths[0]], torch.from_numpy(clips[k] / 32768).float(), atol=1e-4)


@pytest.mark.gpu
def test_audio_graph_on_the_gpu_gives_the_cpu_pipelines_batches(wav_clips):
    paths, _ = wav_clips

    def batches(device_id):
        dl = DALILoader(FileListSource(paths, list(range(10))), functools.partial(audio_graph, gpu=device_id is not None),
                        4, device_id=device_id, num_threads=2, read_threads=2, pipelines=2)  # fmt: skip
        try:
            epoch = list(dl)
            return [tuple(t.cpu() for t in b) for b in epoch], [b[0].device.type for b in epoch]
        finally:
            dl.close()

    (cpu, _), (gpu, where) = batches(None), batches(torch.cuda.current_device())
    assert set(where) == {"cuda"} and len(cpu) == len(gpu) == 3
    for a, b in zip(cpu, gpu, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
