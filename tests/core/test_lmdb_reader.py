"""The pack reader's caches never outlive the file they cache: a pack replaced at the same path is read fresh by a
new reader, and a reader that opened the old file raises, naming the pack, instead of mixing the two."""

from __future__ import annotations

import os

import pytest
from torch.utils.data import DataLoader

from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.core.lmdb import StalePackError, pack_image_folder
from lightning_gpu_boost.datamodules import LMDBDataModule


@pytest.fixture
def two_trees(tmp_path):
    small = dict(size_range=(40, 56, 32, 48), progress=False)
    return (make_jpeg_folder(tmp_path / "a", n=20, num_classes=2, **small),
            make_jpeg_folder(tmp_path / "b", n=12, num_classes=3, **small))  # fmt: skip


def _repack(tree, pack):
    os.remove(pack)
    pack_image_folder(tree, pack, progress=False)


def test_a_pack_rebuilt_at_the_same_path_is_read_fresh(two_trees, tmp_path):
    pack = pack_image_folder(two_trees[0], tmp_path / "p.lmdb", progress=False)
    old = LMDBDataModule(str(pack), image_size=16, batch_size=4, num_workers=0)
    assert (len(old.train_dataset()), old.num_classes) == (20, 2)
    next(iter(old.train_dataloader()))
    _repack(two_trees[1], pack)
    new = LMDBDataModule(str(pack), image_size=16, batch_size=4, num_workers=0)
    assert (len(new.train_dataset()), new.num_classes) == (12, 3)
    labels = [int(label) for _, batch in new.train_dataloader() for label in batch]
    assert sorted(set(labels)) == [0, 1, 2] and len(labels) == 12


def test_workers_of_a_reader_opened_before_the_rebuild_raise_naming_the_pack(two_trees, tmp_path):
    pack = pack_image_folder(two_trees[0], tmp_path / "p.lmdb", progress=False)
    old = LMDBDataModule(str(pack), image_size=16, batch_size=4, num_workers=2, persistent_workers=False)
    dataset = old.train_dataset()
    _repack(two_trees[1], pack)
    with pytest.raises(StalePackError, match="p.lmdb.*was replaced"):
        next(iter(DataLoader(dataset, batch_size=4, num_workers=2)))


def test_a_long_lived_reader_raises_once_its_file_is_replaced(two_trees, tmp_path, monkeypatch):
    from lightning_gpu_boost.core.lmdb import reader as lmdb_reader
    from lightning_gpu_boost.core.lmdb import sharded

    monkeypatch.setattr(lmdb_reader, "CHECK_EVERY", 2)
    pack = pack_image_folder(two_trees[0], tmp_path / "p.lmdb", progress=False)
    reader = sharded.open_pack(pack)
    reader.read(0)
    _repack(two_trees[1], pack)
    with pytest.raises(StalePackError, match="was replaced"):
        for i in range(4):
            reader.read(i)
    os.remove(pack)
    with pytest.raises(StalePackError, match="removed"):
        reader.check_current()
