"""Verifying a pack (``core/lmdb/verify.py``): a flipped byte names its record; truncated, empty and foreign
files are not ok."""

from __future__ import annotations

import pytest

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")

from lightning_gpu_boost.core import lmdb as lf
from lightning_gpu_boost.core.images import scan_image_folder


def test_flipped_byte_names_the_record(tree, tmp_path):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    target = open(scan_image_folder(tree)[0][5][0], "rb").read()[
        -200:-160
    ]  # entropy-coded: unique to record 5
    data = bytearray(path.read_bytes())
    assert data.count(target) == 1
    at = data.find(target)
    data[at + 3] ^= 0xFF
    broken = tmp_path / "broken.lmdb"
    broken.write_bytes(bytes(data))
    summary = lf.verify(broken)
    assert not summary["ok"] and any("Record 5 is corrupt" in e for e in summary["errors"])
    with pytest.raises(lf.CorruptRecordError, match="Record 5 is corrupt"):
        lf.PackReader(broken, check_crc=True).read(5)


def test_truncated_file_is_an_error(tree, tmp_path):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    truncated = tmp_path / "truncated.lmdb"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    summary = lf.verify(truncated)  # a summary on every outcome, never a traceback
    assert not summary["ok"] and summary["errors"], summary
    for name, data in (("empty.lmdb", b""), ("text.lmdb", b"not an lmdb file\n" * 100)):
        (tmp_path / name).write_bytes(data)
        summary = lf.verify(tmp_path / name)
        assert not summary["ok"] and summary["errors"][0].startswith("cannot open"), summary
    assert not lf.verify(tmp_path / "missing.lmdb")["ok"]
