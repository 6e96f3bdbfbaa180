"""LMDB's B-tree pages (``core/lmdb/pages.py``): branch and leaf pages named and asked for once, record
extents, and what they refuse."""

from __future__ import annotations

import pickle

import pytest

from lightning_gpu_boost.core.lmdb import pages as lmdb_pages


class _Payloads:
    """``count`` records of ``size`` to ``size + 49`` bytes (inline in their leaf pages when small, on overflow pages
    when large)."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        return (bytes([i % 251]) * (self.size + i % 50), i % 7)


def test_the_b_tree_pages_are_named_and_asked_for_once(tmp_path, monkeypatch):
    """tree_pages names every branch and leaf page of the records' B-tree (LMDB's own count), none of the values'
    pages; a reader asks for them once per process, in runs of consecutive pages."""
    import os
    import struct

    from lightning_gpu_boost.core.lmdb import pack_dataset, sharded
    from lightning_gpu_boost.core.lmdb import reader as lmdb_reader

    class Tiny:
        def __len__(self) -> int:
            return 60_000  # a three-level tree

        def __getitem__(self, i: int):
            return (b"x" * 16, i % 7)

    from lightning_gpu_boost.core.lmdb import page_cache

    monkeypatch.setattr(page_cache, "WHOLE_PACK_PREFETCH_FRACTION", 0)  # no prefetch thread beside the test's calls
    pack = pack_dataset(Tiny(), tmp_path / "tiny.lmdb", progress=False)
    reader = sharded.open_pack(pack)
    env = reader._open()
    with env.begin() as txn:
        stat, record = txn.stat(reader._dbs[b"records"]), txn.get(b"records")
    pages = lmdb_pages.tree_pages(str(pack), record, stat["psize"])
    assert stat["depth"] == 3 and len(pages) == len(set(pages)) == stat["branch_pages"] + stat["leaf_pages"]
    with open(pack, "rb") as f:
        flags = []
        for pgno in pages:
            f.seek(pgno * stat["psize"])
            flags.append(struct.unpack_from("<QHHHH", f.read(16))[2])
    assert flags.count(1) == stat["branch_pages"] and flags.count(2) == stat["leaf_pages"]  # P_BRANCH, P_LEAF
    assert lmdb_pages.tree_pages(str(pack), b"\0" * 10, stat["psize"]) == []  # not a database record
    if not hasattr(os, "posix_fadvise"):
        return
    asked = []
    monkeypatch.setattr(lmdb_reader.os, "posix_fadvise", lambda fd, off, n, advice: asked.append((off, n, advice)))
    assert reader._read_tree_ahead() == len(pages) and reader._read_tree_ahead() == 0
    covered = {off // stat["psize"] + k for off, n, _ in asked for k in range(n // stat["psize"])}
    assert covered == set(pages) and {a for *_, a in asked} == {os.POSIX_FADV_WILLNEED}


@pytest.mark.parametrize(("count", "size"), [(60_000, 16), (3_000, 4_000), (5, 1_500), (1, 100_000)])
def test_record_extents_name_where_every_record_lies(tmp_path, count, size):
    """record_extents reads the leaf pages for each record's place in the file: the map's bytes there are the
    record's bytes (small values inline in a leaf page, large ones on overflow pages, trees of 1-3 levels), so a
    block's span is the one a lookup of its first and last records gives."""
    import sys

    from lightning_gpu_boost.core.lmdb import KEY, pack_dataset, sharded
    from lightning_gpu_boost.core.lmdb import reader as lmdb_reader

    if not sys.platform.startswith("linux"):
        pytest.skip("/proc/self/maps and posix_fadvise are Linux's")
    pack = pack_dataset(_Payloads(count, size), tmp_path / "p.lmdb", progress=False)
    reader = sharded.open_pack(pack)
    assert reader._read_tree_ahead() > 0
    extents = reader._extents
    assert extents.shape == (count, 2) and reader._base == lmdb_pages._map_base(str(pack))
    txn = reader._txn()
    for i in sorted({0, count - 1, *range(0, count, max(1, count // 300))}):
        value = txn.get(KEY.pack(i))
        assert lmdb_reader._address(value) == reader._base + extents[i, 0] and len(value) == extents[i, 1]
    lo, hi = count // 3, max(count // 3 + 1, 2 * count // 3)
    with_extents = reader._span(lo, hi)
    reader._extents = None  # found by lookups instead
    assert reader._span(lo, hi) == with_extents
    assert pickle.loads(pickle.dumps(reader)).__dict__.get("_extents") is None


def test_record_extents_refuse_what_they_do_not_expect(tmp_path):
    """Anything not as expected gives None (spans are then found by lookups): leaf pages out of key order, a count
    that is not the pack's, no leaves, branch pages given as leaves."""
    from lightning_gpu_boost.core.lmdb import pack_dataset, sharded

    pack = pack_dataset(_Payloads(60_000, 16), tmp_path / "p.lmdb", progress=False)
    reader = sharded.open_pack(pack)
    env = reader._open()
    with env.begin() as txn:
        record, psize = txn.get(b"records"), env.stat()["psize"]
    branches, leaves = lmdb_pages._tree_levels(str(pack), record, psize)
    assert lmdb_pages.record_extents(str(pack), leaves, psize, 60_000) is not None
    assert lmdb_pages.record_extents(str(pack), leaves[::-1], psize, 60_000) is None
    assert lmdb_pages.record_extents(str(pack), leaves, psize, 59_999) is None
    assert lmdb_pages.record_extents(str(pack), [], psize, 60_000) is None
    assert lmdb_pages.record_extents(str(pack), branches, psize, 60_000) is None
