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
