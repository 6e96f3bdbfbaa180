"""A stream's local chunk cache, read from the disk: how fast it grows while training (the bytes downloaded), so
that a wait for data can be told to be a wait on the link."""

from __future__ import annotations

import os
import time

__all__ = ["CacheGrowth", "cache_files"]


def cache_files(path: str) -> dict[str, int]:
    """Every file under ``path`` with its size in bytes (``{}`` where ``path`` does not exist yet)."""
    found: dict[str, int] = {}
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    found[entry.path] = entry.stat(follow_symlinks=False).st_size
            except OSError:  # removed meanwhile (the cache evicts chunks, downloads rename their partial files)
                continue
    return found


class CacheGrowth:
    """Bytes that arrived in the cache folder ``path`` between two calls of :meth:`bytes_per_s`: new files and
    files that grew (a chunk evicted and downloaded again counts again).

    Example::

        >>> import tempfile
        >>> growth = CacheGrowth(tempfile.mkdtemp())
        >>> growth.bytes_per_s() is None  # the first call only starts the count
        True
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._last: dict[str, int] | None = None
        self._at = 0.0
        #: bytes arrived since the first call
        self.total_bytes = 0

    def bytes_per_s(self) -> float | None:
        """Bytes/s that arrived since the last call; ``None`` on the first."""
        now, at = cache_files(self.path), time.monotonic()
        last, since = self._last, self._at
        self._last, self._at = now, at
        if last is None or at <= since:
            return None
        grown = sum(size - last.get(name, 0) for name, size in now.items() if size > last.get(name, 0))
        self.total_bytes += grown
        return grown / (at - since)
