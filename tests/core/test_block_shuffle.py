"""Block-shuffled order: every record once per epoch, runs of consecutive records, DDP shards by block, a new order
each epoch, mid-epoch resume, and how random it is against a full shuffle."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_gpu_boost.core.block_shuffle import (
    BlockShuffleSampler,
    block_order,
    block_size_for,
    order_stats,
)
from lightning_gpu_boost.core.resume import ResumableDataLoader
from tests.helpers import IndexDataset, RecordingModel, run_ddp


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_record_once_per_epoch_equal_shares_whole_blocks(world):
    n, block, window = 103, 8, 2
    shares = [block_order(n, block, window, seed=5, epoch=0, rank=r, num_replicas=world) for r in range(world)]
    assert len({len(s) for s in shares}) == 1, "every rank steps as often"
    flat = [i for s in shares for i in s]
    assert set(flat) == set(range(n)) and len(flat) - n == (-n) % world  # only the padding repeats
    owners: dict[int, set[int]] = {}
    for r, share in enumerate(shares):
        for i in share:
            owners.setdefault(i // block, set()).add(r)
    assert sum(len(o) > 1 for o in owners.values()) <= 2 * (world - 1), "ranks share at most their boundary blocks"
    for share in shares:  # a window of positions touches at most window + 1 blocks: reads come in runs
        for s in range(0, len(share), block * window):
            assert len({i // block for i in share[s : s + block * window]}) <= window + 1
    dropped = [block_order(n, block, window, 5, 0, r, world, drop_last=True) for r in range(world)]
    assert len({i for s in dropped for i in s}) == sum(map(len, dropped)) == (n // world) * world


def test_a_new_order_each_epoch_the_same_for_the_same_seed():
    sampler = BlockShuffleSampler(range(64), block_size=4, window_blocks=2, seed=3)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert sorted(first) == sorted(second) == list(range(64)) and first != second
    again = BlockShuffleSampler(range(64), block_size=4, window_blocks=2, seed=3)
    assert list(again) == first and list(BlockShuffleSampler(range(64), 4, 2, seed=4)) != first


def test_resume_continues_the_same_order():
    sampler = BlockShuffleSampler(range(50), block_size=5, window_blocks=2, seed=1)
    sampler.set_epoch(2)
    order = list(sampler)
    state = sampler.state_dict(consumed=20)
    other = BlockShuffleSampler(range(50), block_size=5, window_blocks=2, seed=1)
    other.load_state_dict(state)
    assert other.epoch == 2 and len(other) == 50 and list(other) == order[20:]
    assert list(other) == order, "the next epoch starts from its beginning"
    with pytest.raises(ValueError, match="block_size=5 on a sampler with block_size=6"):
        BlockShuffleSampler(range(50), block_size=6, window_blocks=2, seed=1).load_state_dict(state)


@pytest.mark.parametrize("kwargs,match", [({"block_size": 0}, "block_size must be an int >= 1"),
                                          ({"block_size": 4, "window_blocks": 0}, "window_blocks must be"),
                                          ({"block_size": 4, "seed": -1}, "seed must be")])  # fmt: skip
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BlockShuffleSampler(range(8), **kwargs)


def test_block_size_from_bytes_and_order_stats():
    assert block_size_for(1000, 100 * 1000, block_bytes=4000) == 40 and block_size_for(0, 0) == 1
    labels = [i // 100 for i in range(1000)]  # a pack written class by class, as folders are scanned
    key = order_stats(list(range(1000)), labels, 50)
    block = order_stats(block_order(1000, 10, 8, seed=0, epoch=0), labels, 50)
    assert key["position_corr"] > 0.99 and key["labels_per_batch"] == 1.0
    assert block["position_corr"] < 0.2 and block["labels_per_batch"] > 2


def test_a_trainer_resumes_mid_epoch_without_repeating_or_skipping(tmp_path, trainer_kwargs):
    def loader():
        return ResumableDataLoader(IndexDataset(24), batch_size=4,
                                  sampler=BlockShuffleSampler(IndexDataset(24), block_size=3, window_blocks=2))  # fmt: skip

    first = RecordingModel()
    kwargs = {**trainer_kwargs, "enable_checkpointing": True, "default_root_dir": str(tmp_path)}
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1, save_last=False)
    pl.Trainer(callbacks=[ckpt], max_steps=3, **kwargs).fit(first, loader())
    resumed = RecordingModel()
    pl.Trainer(max_epochs=1, **trainer_kwargs).fit(resumed, loader(), ckpt_path=sorted(tmp_path.glob("*step=3.ckpt"))[0])
    seen = [i for batch in first.seen["train"] + resumed.seen["train"] for i in batch]
    assert len(first.seen["train"]) == 3 and sorted(seen) == list(range(24)), (first.seen, resumed.seen)
    whole = RecordingModel()
    pl.Trainer(max_epochs=1, **trainer_kwargs).fit(whole, loader())
    assert first.seen["train"] + resumed.seen["train"] == whole.seen["train"], "the resumed order is the same"


def test_lmdb_datamodule_reads_its_pack_in_block_order(tmp_path):
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.lmdb import pack_image_folder
    from lightning_gpu_boost.datamodules import LMDBDataModule

    root = make_jpeg_folder(tmp_path / "src", n=24, num_classes=2, size_range=(64, 80, 48, 64), progress=False)
    pack = pack_image_folder(root, tmp_path / "train.lmdb", progress=False)
    dm = LMDBDataModule(str(pack), image_size=32, batch_size=4, num_workers=0, order="block", block_bytes=4096,
                        window_blocks=2)  # fmt: skip
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert isinstance(loader, ResumableDataLoader) and isinstance(loader.sampler, BlockShuffleSampler)
    assert 1 <= loader.sampler.block_size <= 4 and sum(len(b[1]) for b in loader) == 24
    with pytest.raises(ValueError, match="order"):
        LMDBDataModule(str(pack), order="blocks")


def test_ddp_ranks_read_disjoint_blocks_that_cover_the_epoch(tmp_path):
    results = run_ddp(
        """
        import lightning.pytorch as pl
        from lightning_gpu_boost.core.block_shuffle import BlockShuffleSampler
        from lightning_gpu_boost.core.resume import ResumableDataLoader
        model = RecordingModel()
        trainer = pl.Trainer(accelerator="cpu", devices=NPROCS, strategy="ddp", max_epochs=2, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        data = IndexDataset(48)
        trainer.fit(model, ResumableDataLoader(data, batch_size=4, sampler=BlockShuffleSampler(data, 6, 2)))
        epochs = [sum(model.seen["train"][:6], []), sum(model.seen["train"][6:], [])]
        (OUT / f"rank{trainer.global_rank}.json").write_text(json.dumps(epochs))
        """,
        tmp_path,
    )
    for epoch in (0, 1):
        shards = [set(r[epoch]) for r in results]
        assert shards[0].isdisjoint(shards[1]) and shards[0] | shards[1] == set(range(48))
        blocks = [{i // 6 for i in s} for s in shards]
        assert len(blocks[0] & blocks[1]) <= 1, "ranks read whole blocks (at most one split at the boundary)"
    assert results[0][0] != results[0][1]


def test_a_pack_written_in_shuffled_order_mixes_classes_in_block_order(tmp_path):
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.lmdb import open_pack, pack_image_folder

    root = make_jpeg_folder(tmp_path / "src", n=40, num_classes=4, size_range=(32, 40, 32, 40), progress=False)
    plain = open_pack(pack_image_folder(root, tmp_path / "plain.lmdb", progress=False))
    mixed = open_pack(pack_image_folder(root, tmp_path / "mixed.lmdb", progress=False, shuffle_seed=1))
    labels = [plain.read(i, lambda r: r.label) for i in range(len(plain))]
    shuffled = [mixed.read(i, lambda r: r.label) for i in range(len(mixed))]
    assert labels == sorted(labels) and sorted(shuffled) == labels and shuffled != labels
    assert mixed.meta("shuffle_seed") == 1 and plain.meta("shuffle_seed") is None
    order = block_order(40, 5, 1, seed=0, epoch=0)
    assert order_stats(order, shuffled, 8)["labels_per_batch"] > order_stats(order, labels, 8)["labels_per_batch"]
    assert sorted(mixed.meta("paths")) == sorted(plain.meta("paths"))


def test_a_block_is_asked_for_in_one_read_the_first_time_one_of_its_records_is_read(tmp_path):
    from lightning_gpu_boost.core.block_shuffle import BlockReadAhead
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.lmdb import open_pack, pack_image_folder

    root = make_jpeg_folder(tmp_path / "src", n=30, num_classes=3, size_range=(64, 80, 48, 64), progress=False)
    reader = open_pack(pack_image_folder(root, tmp_path / "train.lmdb", progress=False))
    linux = __import__("sys").platform.startswith("linux")
    assert reader.will_need(0, 10) is linux and reader.will_need(25, 40) is linux  # clipped to the pack
    assert reader.will_need(5, 5) is False and reader.will_need(40, 50) is False
    sharded = open_pack(pack_image_folder(root, tmp_path / "sharded.lmdb", progress=False, shard_size=8))
    assert sharded.will_need(6, 20) is linux  # spans three shards

    class Recording:
        def __init__(self, inner):
            self.inner, self.asked = inner, []

        def will_need(self, lo, hi):
            self.asked.append((lo, hi))
            return self.inner.will_need(lo, hi)

    recording = Recording(reader)
    ahead = BlockReadAhead(recording, block_size=8, records=30, remember=2)
    for i in (3, 5, 0, 29, 24, 9, 3):  # block 0 is forgotten after blocks 3 and 1: asked for again
        ahead(i)
    assert recording.asked == [(0, 8), (24, 30), (8, 16), (0, 8)]
    with pytest.raises(ValueError, match="block_size"):
        BlockReadAhead(reader, block_size=0, records=30)


def test_the_lmdb_datamodule_reads_blocks_a_window_ahead(tmp_path, monkeypatch):
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.lmdb import close_readers, pack_image_folder, page_cache
    from lightning_gpu_boost.datamodules import LMDBDataModule

    root = make_jpeg_folder(tmp_path / "src", n=24, num_classes=2, size_range=(64, 80, 48, 64), progress=False)
    pack = pack_image_folder(root, tmp_path / "train.lmdb", progress=False, shuffle_seed=0)
    args = {"image_size": 32, "batch_size": 4, "order": "block", "block_bytes": 16384, "window_blocks": 2}
    dm = LMDBDataModule(str(pack), num_workers=2, **args)
    dm.setup("fit")
    loader = dm.train_dataloader()  # a pack that fits in memory was asked for whole when opened: nothing more
    assert loader.dataset.reader.read_whole and loader.sampler.will_need is None
    close_readers(pack)
    monkeypatch.setattr(page_cache, "WHOLE_PACK_PREFETCH_FRACTION", 0.0)  # read as one bigger than memory is
    dm = LMDBDataModule(str(pack), num_workers=2, **args)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.sampler.will_need == loader.dataset.reader.will_need  # the sampler asks a window ahead
    labels = [label for _, batch in loader for label in batch.tolist()]
    reader = loader.dataset.reader
    assert sorted(labels) == sorted(reader.read(i, lambda r: r.label) for i in range(24))
    dm = LMDBDataModule(str(pack), image_size=32, batch_size=4, num_workers=0, order="block", block_bytes=16384,
                        window_blocks=2)  # fmt: skip
    dm.setup("fit")
    loader = dm.train_dataloader()  # no workers: this process reads the blocks, so they are mapped ahead too
    assert loader.sampler.will_need.func == loader.dataset.reader.will_need
    assert loader.sampler.will_need.keywords == {"populate": True}
    assert sorted(label for _, batch in loader for label in batch.tolist()) == sorted(labels)


def test_the_next_window_is_asked_for_when_a_window_starts():
    from lightning_gpu_boost.core.block_shuffle import read_ahead_windows

    asked, seen = [], []
    order = block_order(20, 3, 2, seed=0, epoch=0)
    for i in read_ahead_windows(order, 3, 2, lambda lo, hi: asked.append((lo, hi, len(seen))), 20):
        seen.append(i)
    assert seen == order
    windows = [order[s : s + 6] for s in range(0, 20, 6)]
    for k, window in enumerate(windows):  # window 0 before the first record, window k + 1 as window k starts
        blocks = {(b * 3, min(20, b * 3 + 3)) for b in {i // 3 for i in window}}
        when = 0 if k == 0 else 6 * (k - 1)
        assert blocks == {(lo, hi) for lo, hi, at in asked if at == when and (lo, hi) in blocks}
    sampler = BlockShuffleSampler(range(20), 3, 2, seed=0)
    sampler.will_need = lambda lo, hi: asked.append((lo, hi))
    asked.clear()
    assert list(sampler) == order and {i // 3 for i in order} == {lo // 3 for lo, _ in asked}


def test_a_failing_read_ahead_never_stops_the_epoch():
    from lightning_gpu_boost.core.block_shuffle import read_ahead_windows

    def broken(lo, hi):
        raise RuntimeError("closed")

    order = block_order(20, 3, 2, seed=0, epoch=0)
    with pytest.warns(UserWarning, match="Reading blocks ahead failed"):
        assert list(read_ahead_windows(order, 3, 2, broken, 20)) == order
