"""``core/streaming/cache.py``: the bytes arriving in a stream's cache folder."""

from __future__ import annotations

import os

from lightning_gpu_boost.core.streaming.cache import CacheGrowth, cache_files


def test_new_and_grown_files_count_once_and_evicted_ones_not_at_all(tmp_path):
    growth = CacheGrowth(str(tmp_path / "cache"))
    assert growth.bytes_per_s() is None and cache_files(str(tmp_path / "cache")) == {}
    (tmp_path / "cache" / "hash").mkdir(parents=True)
    (tmp_path / "cache" / "hash" / "chunk-0.bin").write_bytes(b"x" * 1000)
    assert growth.bytes_per_s() > 0 and growth.total_bytes == 1000
    with open(tmp_path / "cache" / "hash" / "chunk-0.bin", "ab") as f:
        f.write(b"y" * 500)
    (tmp_path / "cache" / "hash" / "chunk-1.bin").write_bytes(b"z" * 200)
    growth.bytes_per_s()
    assert growth.total_bytes == 1700
    os.remove(tmp_path / "cache" / "hash" / "chunk-1.bin")  # evicted
    assert growth.bytes_per_s() == 0 and growth.total_bytes == 1700
