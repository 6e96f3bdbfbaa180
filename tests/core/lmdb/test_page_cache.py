"""The page cache (``core/lmdb/page_cache.py``): small packs read ahead whole at open, reading ahead in forked
children, long ranges asked for chunk by chunk."""

from __future__ import annotations

import os
import threading

import pytest

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")



from lightning_gpu_boost.core import lmdb as lf


def test_small_packs_are_read_ahead_whole_at_open(tree, tmp_path, monkeypatch):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    advised = []
    real = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: advised.append(advice) or real(fd, offset, length, advice))
    lf.close_readers(path)
    lf.PackReader(path, readahead=False).read(0)
    assert advised == []  # readahead=False: the caller expects random reads of a large pack
    lf.close_readers(path)
    lf.PackReader(path).read(0)
    for thread in threading.enumerate():  # the request runs in a daemon thread, chunk by chunk
        if thread.name == "lgb-pack-prefetch":
            thread.join(10)
    assert advised and set(advised) == {os.POSIX_FADV_WILLNEED}
    asked = len(advised)
    lf.PackReader(path).read(1)  # once per file and process (tree): not asked for again while it stays open
    assert len(advised) == asked and not any(t.name == "lgb-pack-prefetch" for t in threading.enumerate())
    lf.close_readers(path)


def _ask_in_child(pack: str, out) -> None:
    from lightning_gpu_boost.core.lmdb import reader as lmdb_reader
    from lightning_gpu_boost.core.lmdb import sharded

    reader = sharded.open_pack(pack)
    asked = reader.will_need(0, 10)
    lmdb_reader.wait_for_read_ahead()  # a thread of its own (the parent's did not survive the fork)
    label = reader.read(3, lambda r: r.label)
    lmdb_reader.close_readers(pack)  # the close lock is this process's, free
    out.put((asked, label))


def test_reading_ahead_goes_on_in_a_forked_child_while_the_parent_reads_ahead(tmp_path):
    """The read-ahead thread and its locks are per process: a DataLoader worker forked while the parent's thread
    looks a block up gets a new thread and free locks (no deadlock), and both processes' reads go on."""
    import multiprocessing
    import sys

    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.lmdb import pack_image_folder, sharded
    from lightning_gpu_boost.core.lmdb import reader as lmdb_reader

    if not sys.platform.startswith("linux"):
        pytest.skip("fork and madvise are Linux's here")
    root = make_jpeg_folder(tmp_path / "src", n=30, num_classes=3, size_range=(64, 80, 48, 64), progress=False)
    pack = str(pack_image_folder(root, tmp_path / "train.lmdb", progress=False))
    reader = sharded.open_pack(pack)
    for lo in range(0, 30, 2):  # the parent's thread busy while the child is forked
        reader.will_need(lo, lo + 2)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_ask_in_child, args=(pack, out))
    child.start()
    asked, label = out.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0 and asked is True and label == reader.read(3, lambda r: r.label)
    lmdb_reader.wait_for_read_ahead()
    assert reader.will_need(0, 30)


def test_long_ranges_are_asked_for_chunk_by_chunk(tmp_path, monkeypatch):
    """Linux reads at most one readahead chunk per WILLNEED request: a block, and a whole small pack at open, are
    asked for in chunks (the rest would silently not be read)."""
    import sys

    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.lmdb import pack_image_folder, page_cache, sharded
    from lightning_gpu_boost.core.lmdb import reader as lmdb_reader

    chunk = page_cache.readahead_chunk(str(tmp_path))
    assert chunk >= 128 << 10 and chunk % 1024 == 0
    if not sys.platform.startswith("linux"):
        pytest.skip("madvise and posix_fadvise are Linux's")
    root = make_jpeg_folder(tmp_path / "src", n=40, num_classes=2, size_range=(200, 240, 200, 240), progress=False)
    pack = pack_image_folder(root, tmp_path / "train.lmdb", progress=False)
    asked, advised = [], []
    monkeypatch.setattr(lmdb_reader, "_MADVISE", lambda addr, length, advice: asked.append((addr, length, advice)) or 0)
    monkeypatch.setattr(lmdb_reader, "readahead_chunk", lambda path: 16384)
    monkeypatch.setattr(page_cache, "readahead_chunk", lambda path: 16384)
    monkeypatch.setattr(page_cache, "WHOLE_PACK_PREFETCH_FRACTION", 0)  # no prefetch thread beside the test's calls
    reader = sharded.open_pack(pack)
    assert reader.will_need(0, 40)
    lmdb_reader.wait_for_read_ahead()  # the calls are made by a background thread
    willneed = list(asked)
    assert len(willneed) > 1 and all(n <= 16384 and advice == 3 for _, n, advice in willneed)  # MADV_WILLNEED
    assert all(a + n == b for (a, n, _), (b, _, _) in zip(willneed, willneed[1:], strict=False))  # contiguous
    asked.clear()
    assert reader.will_need(0, 10)
    lmdb_reader.wait_for_read_ahead()
    assert asked and all(advice == 3 for _, _, advice in asked)
    asked.clear()  # populate: every chunk asked for first, then the span mapped in one call (MADV_POPULATE_READ)
    assert reader.will_need(0, 40, populate=True)
    lmdb_reader.wait_for_read_ahead()
    assert [advice for _, _, advice in asked] == [3] * len(willneed) + [22]
    assert asked[-1][:2] == (willneed[0][0], sum(n for _, n, _ in willneed))
    monkeypatch.setattr(lmdb_reader.os, "posix_fadvise", lambda fd, off, n, advice: advised.append((off, n)))
    lmdb_reader.close_readers(pack)
    page_cache._read_whole(str(pack), pack.stat().st_size)
    assert sum(n for _, n in advised) == pack.stat().st_size and max(n for _, n in advised) <= 16384
