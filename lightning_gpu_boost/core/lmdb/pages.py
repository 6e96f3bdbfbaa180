"""LMDB's on-disk pages, read without LMDB: the B-tree levels of a database, the extents of its records and
where the memory map of a file lies (the block read-ahead of :class:`~lightning_gpu_boost.core.lmdb.reader.PackReader`
asks for them)."""

from __future__ import annotations

import os
import struct
from typing import Any

from lightning_gpu_boost.core.lmdb.format import (
    KEY,
)

__all__ = ['record_extents', 'tree_pages']

_P_BRANCH, _P_LEAF = 0x01, 0x02  # LMDB's page flags (mdb.c, format 0.9)
_F_BIGDATA = 0x01  # a leaf node whose value lies on overflow pages (its first page's number stored in the node)
_PAGE_HEADER = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper: 16 bytes
_DB_RECORD = struct.Struct("<IHHQQQQQ")  # MDB_db: pad, flags, depth, branch, leaf, overflow pages, entries, root


def _tree_levels(path: str, db_record: bytes, page_size: int, limit: int = 1 << 20) -> tuple[list[int], list[int]]:
    """One database's B-tree in an LMDB file: its branch pages and its leaf pages in key order (not the overflow
    pages that hold large values). ``db_record`` is the database's record in the main database (its name's value
    there, LMDB's ``MDB_db``: depth and root page); the branch pages are read with ``pread`` (nothing mapped, so no
    read-around), the leaf pages only named by their parents. LMDB 0.9's format with 64-bit page numbers;
    ``([], [])`` where anything is not as expected (reading ahead only saves time)."""
    try:
        _, _, depth, branches, leaves, _, _, root = _DB_RECORD.unpack(bytes(db_record))
    except struct.error:
        return [], []
    if depth < 1 or branches + leaves > limit:
        return [], []
    found, level = [], [root]
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(depth - 1):  # branch levels: read each page, name its children (in key order)
            children = []
            for pgno in level:
                page = os.pread(fd, page_size, pgno * page_size)
                if len(page) < _PAGE_HEADER.size:
                    return [], []
                _, _, flags, lower, _ = _PAGE_HEADER.unpack_from(page)
                if not flags & _P_BRANCH or not _PAGE_HEADER.size <= lower <= page_size:
                    return [], []
                for k in range((lower - _PAGE_HEADER.size) // 2):
                    (offset,) = struct.unpack_from("<H", page, _PAGE_HEADER.size + 2 * k)
                    if offset + 8 > page_size:
                        return [], []
                    lo, hi, high = struct.unpack_from("<HHH", page, offset)  # a branch node: its child's number
                    children.append(lo | hi << 16 | high << 32)
            found += level
            level = children
            if len(found) + len(level) > limit:
                return [], []
    except OSError:
        return [], []
    finally:
        os.close(fd)
    return found, level


def tree_pages(path: str, db_record: bytes, page_size: int, limit: int = 1 << 20) -> list[int]:
    """The page numbers of one database's B-tree in an LMDB file (:func:`_tree_levels`): branch pages, then leaf
    pages; ``[]`` where anything is not as expected."""
    branches, leaves = _tree_levels(path, db_record, page_size, limit)
    return branches + leaves


def record_extents(path: str, leaves: list[int], page_size: int, count: int) -> Any:
    """Where records ``0 .. count - 1`` of a pack lie in its file, read from the records database's leaf pages
    (:func:`_tree_levels`, in key order) with ``pread``: an ``(count, 2)`` int64 array of each value's byte offset
    and length (a large value's overflow pages, a small one's place in its leaf page), so that a block's span is
    found without touching its records (a lookup through the memory map faults on the value's first page, and on a
    cold cache that fault reads the kernel's read-around in the asking thread). LMDB 0.9's format; ``None`` where
    anything is not as expected (keys other than ``0 .. count - 1`` in order, duplicate or sub-databases, a short
    read): then spans are found by lookups."""
    import numpy as np

    if not leaves or count <= 0:
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        runs, start = [], 0  # runs of consecutive leaf pages, one pread each
        for k in range(1, len(leaves) + 1):
            if k == len(leaves) or leaves[k] != leaves[k - 1] + 1 or k - start >= 256:
                runs.append((start, k))
                start = k
        pages = bytearray(len(leaves) * page_size)  # read in place: no second copy
        view = memoryview(pages)
        for a, b in runs:
            if os.preadv(fd, [view[a * page_size : b * page_size]], leaves[a] * page_size) != (b - a) * page_size:
                return None
    except OSError:
        return None
    finally:
        os.close(fd)
    buf = np.frombuffer(pages, dtype=np.uint8)
    header = buf.reshape(len(leaves), page_size)[:, : _PAGE_HEADER.size].copy().view("<u2")  # pgno x4, pad, flags, lower, upper
    flags, lower = header[:, 5], header[:, 6].astype(np.int64)
    if ((flags & 0x27) != _P_LEAF).any() or (lower < _PAGE_HEADER.size).any() or (lower > page_size).any():
        return None  # each a plain leaf page (not a branch, overflow or LEAF2 page)
    nodes = (lower - _PAGE_HEADER.size) // 2
    if int(nodes.sum()) != count:
        return None
    u16 = buf.view("<u2")
    node_at = np.concatenate([u16[(i * page_size + _PAGE_HEADER.size) // 2 :][: int(n)].astype(np.int64) + i * page_size
                              for i, n in enumerate(nodes)])  # fmt: skip
    in_page = node_at % page_size
    if (node_at % 2).any() or (in_page < _PAGE_HEADER.size).any() or (in_page + 8 + KEY.size > page_size).any():
        return None  # LMDB's nodes are 2-byte aligned, each with its 8-byte header and its key in its page

    def words(offset: int, n: int, at: Any = node_at) -> Any:  # ``n`` 2-byte words from byte ``offset``, in file order
        return u16[(at // 2 + offset // 2)[:, None] + np.arange(n)]

    head = words(0, 4).astype(np.int64)  # data size (low, high), node flags, key size
    size, node_flags, key_size = head[:, 0] | head[:, 1] << 16, head[:, 2], head[:, 3]
    if (key_size != KEY.size).any() or (node_flags & ~_F_BIGDATA).any():
        return None  # other keys, or duplicate / sub-database nodes
    if not np.array_equal(words(8, 4).copy().view(">u8").ravel(), np.arange(count, dtype=np.uint64)):
        return None
    big = (node_flags & _F_BIGDATA) != 0
    if (in_page + 8 + KEY.size + np.where(big, 8, size) > page_size).any():
        return None  # an overflow page's number, or a small value, past its page
    offset = np.repeat(np.asarray(leaves, dtype=np.int64), nodes) * page_size + in_page + 8 + KEY.size
    if big.any():
        overflow = words(8 + KEY.size, 4, node_at[big]).copy().view("<u8").ravel().astype(np.int64)
        offset[big] = overflow * page_size + _PAGE_HEADER.size
    return np.stack([offset, size], axis=1)


def _map_base(path: str) -> int | None:
    """Where this process maps ``path`` from its first byte (``/proc/self/maps``; py-lmdb's ``info()`` says 0), or
    ``None``."""
    try:
        st = os.stat(path)
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 6 or int(parts[2], 16) != 0 or int(parts[4]) != st.st_ino:
                    continue
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                if (major, minor) == (os.major(st.st_dev), os.minor(st.st_dev)):
                    return int(parts[0].split("-")[0], 16)
    except (OSError, ValueError):
        pass
    return None
