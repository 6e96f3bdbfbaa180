"""The pack writer (``core/lmdb/writer.py``): space reserved up front, each commit starts the writeback."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")

from lightning_gpu_boost.core import lmdb as lf
from lightning_gpu_boost.core.images import scan_image_folder


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fallocate is Linux's")
def test_pack_space_is_reserved_up_front(tree, tmp_path):
    writer = lf.PackWriter(tmp_path / "p.lmdb", "fp", reserve=8 << 20)
    assert os.stat(writer.partial).st_blocks * 512 >= 8 << 20  # allocated, though nothing is written yet
    writer.add(b"x" * 100, 1)
    out = writer.finish({"kind": "test"})
    assert os.path.getsize(out) < 1 << 20  # the unused reservation is given back


def test_each_commit_starts_the_writeback(tree, tmp_path, monkeypatch):
    started = []
    from lightning_gpu_boost.core.lmdb import writer

    monkeypatch.setattr(writer, "_writeback", lambda: started.append)
    lf.pack_image_folder(tree, tmp_path / "pack.lmdb", commit_every=5, progress=False)
    assert len(started) == -(-len(scan_image_folder(tree)[0]) // 5) and all(fd >= 0 for fd in started)


def test_a_second_writer_to_the_same_destination_is_refused_while_the_first_writes(tmp_path):
    from lightning_gpu_boost.core.lmdb.writer import PackWriter, being_written

    dst = tmp_path / "a.lmdb"
    first = PackWriter(dst, "src")
    first.add_value(b"x")
    first.commit(force=True)
    assert being_written(dst)
    for resume in (False, True):  # not even a resume may write beside it
        with pytest.raises(FileExistsError, match=rf"being written by another process \(pid {os.getpid()} holds the lock"):
            PackWriter(dst, "src", resume=resume)
    first.close()  # the first writer stopped (as after kill -9: the lock goes with its descriptor)
    assert not being_written(dst)
    with pytest.raises(FileExistsError, match="interrupted pack"):
        PackWriter(dst, "src")
    again = PackWriter(dst, "src", resume=True)
    assert again.next_index == 1
    again.finish({})
    assert dst.exists() and not (tmp_path / "a.lmdb.partial.writer").exists()


def test_readers_and_verify_call_a_pack_being_written_so(tmp_path):
    from lightning_gpu_boost.core.lmdb.writer import PackWriter, _take_writer_lock

    dst = tmp_path / "b.lmdb"
    writer = PackWriter(dst, "src")
    writer.add_value(b"x")
    writer.commit(force=True)
    writer.close()
    held = _take_writer_lock(dst)  # a writer in another process, as the reader sees it
    try:
        with pytest.raises(lf.IncompletePackError, match="being written by another process now"):
            lf.PackReader(f"{dst}.partial").length  # noqa: B018
        with pytest.raises(FileNotFoundError, match="being written by another process now"):
            lf.PackReader(str(dst)).length  # noqa: B018
    finally:
        os.close(held)
