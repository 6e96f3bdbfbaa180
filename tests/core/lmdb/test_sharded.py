"""Sharded packs (``core/lmdb/sharded.py``): shards with a manifest read like one pack."""

from __future__ import annotations

import pytest

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")

from lightning_gpu_boost.cli import main
from lightning_gpu_boost.core import lmdb as lf
from lightning_gpu_boost.core.images import scan_image_folder
from tests.core.lmdb.shared import _records


def test_shards_with_a_manifest_read_like_one_pack(tree, tmp_path):
    from lightning_gpu_boost.datamodules import LMDBDataModule

    one = lf.pack_image_folder(tree, tmp_path / "one.lmdb", progress=False)
    sharded = lf.pack_image_folder(tree, tmp_path / "sharded.lmdb", shard_size=10, progress=False)
    assert lf.is_manifest(sharded) and [lf.shard_path(sharded, k).exists() for k in range(4)] == [
        True
    ] * 3 + [False]
    reader = lf.open_pack(sharded)
    ids = [reader.read(i, lambda r: (bytes(r.payload), r.label)) for i in range(len(reader))]
    assert ids == _records(one)
    summary = lf.verify(sharded)
    assert summary["ok"] and summary["shards"] == 3 and summary["records"] == 24
    images, labels = next(
        iter(LMDBDataModule(str(sharded), image_size=16, batch_size=24, num_workers=0).train_dataloader())
    )
    assert sorted(labels.tolist()) == sorted(label for _, label in scan_image_folder(tree)[0])
    # resume: a lost manifest and a lost last shard are rebuilt, finished shards are kept
    mtime = lf.shard_path(sharded, 0).stat().st_mtime_ns
    sharded.unlink()
    lf.shard_path(sharded, 2).unlink()
    lf.pack_image_folder(tree, sharded, shard_size=10, resume=True, progress=False)
    assert lf.shard_path(sharded, 0).stat().st_mtime_ns == mtime and lf.verify(sharded)["ok"]
    assert main(["verify", str(sharded)]) == 0
