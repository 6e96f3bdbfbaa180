"""The pack format (``core/lmdb/format.py``): samples encoded without pickle, checksums over label and
metadata, zlib's CRC-32 whichever computes it, version 1 packs still read."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")

from lightning_gpu_boost.core import lmdb as lf
from lightning_gpu_boost.core.lmdb import pack as lw


def test_general_samples_never_pickle(tmp_path):
    samples = [
        {"x": np.arange(6, dtype=np.float16).reshape(2, 3), "t": torch.ones(2), "n": i, "s": "ü"}
        for i in range(4)
    ]
    path = lf.pack_dataset(samples, tmp_path / "s.lmdb", progress=False)
    got = lf.PackReader(path).read(3, lambda r: lf.unpack_sample(r.payload))
    assert (
        got["n"] == 3 and got["s"] == "ü" and got["x"].dtype == np.float16 and got["t"].tolist() == [1.0, 1.0]
    )
    with pytest.raises(TypeError, match="Cannot store a object"):
        lf.pack_sample({"bad": object()})


def test_the_checksum_covers_the_label_and_the_metadata(tree, tmp_path):
    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    data = bytearray(path.read_bytes())
    value = lf.PackReader(path).read(3)  # the whole payload: JPEG headers repeat across files
    at = data.find(value) - lf.HEADER.size + 2 + 7  # the label's last byte, in record 3's header
    data[at] ^= 0x01
    broken = tmp_path / "label.lmdb"
    broken.write_bytes(bytes(data))
    with pytest.raises(lf.CorruptRecordError, match="Record 3 is corrupt"):
        lf.PackReader(broken).read(3)  # checked on every read by default
    summary = lf.verify(broken)
    assert not summary["ok"] and summary["bad_records"] == 1
    data = bytearray(path.read_bytes())
    at = data.find(b"class_001")
    data[at + 8] ^= 0x02  # a class name in the metadata
    broken.write_bytes(bytes(data))
    assert "metadata" in lf.verify(broken)["errors"][0]


def test_version_1_packs_still_read(tree, tmp_path):
    import struct
    import zlib

    path = lf.pack_image_folder(tree, tmp_path / "pack.lmdb", progress=False)
    value = bytearray(lf.encode_record(b"payload", label=7))
    struct.pack_into(">B", value, 0, 1)
    struct.pack_into(">I", value, lf.CRC_PREFIX, zlib.crc32(b"payload"))  # version 1: the payload alone
    record = lf.decode_record(0, bytes(value))
    assert record.label == 7 and bytes(record.payload) == b"payload"
    assert lf.PackReader(path).version == lf.SCHEMA_VERSION == 2


def test_crc32_is_zlibs_whichever_computes_it(tmp_path, monkeypatch):
    """lmdb_format.crc32 (ISA-L's where python-isal is installed) gives zlib.crc32's values, so a pack written with
    one reads with the other, and a flipped byte is caught by both."""
    import zlib

    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8).tobytes()
    for view in (data, memoryview(data)[7:], bytearray(data[:5])):
        assert lf.crc32(view) == zlib.crc32(view) and lf.crc32(view, 12345) == zlib.crc32(view, 12345)
    samples = [(bytes([i]) * (5_000 + i), i % 3) for i in range(20)]
    pack = lw.pack_dataset(samples, tmp_path / "p.lmdb", progress=False)
    from lightning_gpu_boost.core.lmdb import format as lmdb_format

    monkeypatch.setattr(lmdb_format, "_CRC32", [zlib.crc32])  # read back with zlib's
    reader = lf.open_pack(pack)
    assert all(reader.read(i, lambda r: len(r.payload)) > 5_000 for i in range(20))  # each CRC checked, none raised
    value = bytearray(lf.encode_record(b"x" * 100))
    value[-1] ^= 1
    for impl in ([zlib.crc32], []):
        monkeypatch.setattr(lmdb_format, "_CRC32", list(impl))
        with pytest.raises(lf.CorruptRecordError):
            lf.decode_record(0, bytes(value))
