"""Sharded packs: :class:`ShardedPackReader` over a JSON manifest of complete packs, and :func:`open_pack` for either
form."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_gpu_boost.core.lmdb.format import (
    MANIFEST_FORMAT,
    READABLE_VERSIONS,
    Record,
    is_manifest,
)
from lightning_gpu_boost.core.lmdb.reader import PackReader

__all__ = ['ShardedPackReader', 'open_pack']

class ShardedPackReader:
    """The same interface as :class:`PackReader` over the shards named by a manifest (global indices)."""

    def __init__(self, path: str | os.PathLike, check_crc: bool = True, readahead: bool = True) -> None:
        import json

        manifest = json.loads(Path(path).read_text())
        if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") not in READABLE_VERSIONS:
            raise ValueError(
                f"{str(path)!r} is not a shard manifest of versions {', '.join(map(str, READABLE_VERSIONS))}."
            )
        self.path, self.manifest = str(path), manifest
        self.shards = manifest["shards"]
        self.length = manifest["length"]
        self.check_crc, self.readahead = check_crc, readahead
        self._readers: dict[int, PackReader] = {}

    def __len__(self) -> int:
        return self.length

    def meta(self, name: str) -> Any:
        return self.manifest.get("meta", {}).get(name)

    def _shard(self, index: int) -> tuple[PackReader, int]:
        import bisect

        if not 0 <= index < self.length:
            raise IndexError(f"Index {index} is out of range for {self.path!r} with {self.length} records.")
        k = bisect.bisect_right([s["offset"] for s in self.shards], index) - 1
        if k not in self._readers:
            shard = Path(self.path).parent / self.shards[k]["path"]
            self._readers[k] = PackReader(shard, self.check_crc, self.readahead)
        return self._readers[k], index - self.shards[k]["offset"]

    def source_path(self, index: int) -> str:
        reader, local = self._shard(index)
        return reader.source_path(local)

    def read(self, index: int, decode: Callable[[Record], Any] = lambda r: bytes(r.payload)) -> Any:
        reader, local = self._shard(index)
        return reader.read(local, decode)

    def will_need(self, lo: int, hi: int, populate: bool = False) -> bool:
        """:meth:`PackReader.will_need` over the shards that hold records ``lo .. hi - 1``."""
        asked = False
        for shard in self.shards:
            a, b = max(lo, shard["offset"]), min(hi, shard["offset"] + shard["length"])
            if a < b:
                reader, local = self._shard(a)
                asked = reader.will_need(local, local + b - a, populate) or asked
        return asked

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_readers": {}}


def open_pack(path: str | os.PathLike, check_crc: bool = True, readahead: bool = True) -> Any:
    """A :class:`PackReader` for a pack file, a :class:`ShardedPackReader` for a shard manifest."""
    cls = ShardedPackReader if is_manifest(path) else PackReader
    return cls(path, check_crc=check_crc, readahead=readahead)
