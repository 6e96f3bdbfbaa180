"""Writing LMDB packs: :class:`PackWriter` (windows committed with their progress, resumable after a crash, the disk
space reserved ahead)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_gpu_boost._imports import require
from lightning_gpu_boost.core.lmdb.format import (
    HEADER,
    KEY,
    META,
    RECORDS,
    SCHEMA_VERSION,
    encode_record,
    meta_crc,
)

__all__ = ['PackWriter']

# -------------------------------------------------------------------------------------------------- writer


def _reserve_disk(path: Path, nbytes: int) -> None:
    """Allocate disk blocks for the first ``nbytes`` of the file without changing its size (Linux ``fallocate``
    with ``FALLOC_FL_KEEP_SIZE``; never glibc's ``posix_fallocate``, which writes zeros where the filesystem cannot
    allocate). Skipped where unsupported; ``OSError`` (ENOSPC) when the disk is too small."""
    if nbytes <= 0 or not sys.platform.startswith("linux"):
        return
    import ctypes
    import errno

    fallocate = getattr(ctypes.CDLL(None, use_errno=True), "fallocate64", None)
    if fallocate is None:
        return
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fd = os.open(path, os.O_RDWR)
    try:
        failed = fallocate(fd, 1, 0, nbytes) != 0  # 1: FALLOC_FL_KEEP_SIZE
        code = ctypes.get_errno() if failed else 0
    finally:
        os.close(fd)
    if code == errno.ENOSPC:
        raise OSError(code, f"Not enough disk space for the pack: it needs about {nbytes / 2**20:,.0f} MiB", str(path))


def _writeback() -> Callable[[int], Any]:
    """A function that starts writing a file's dirty pages to disk without waiting (Linux ``sync_file_range``
    with ``SYNC_FILE_RANGE_WRITE``); a no-op elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            sync_file_range = ctypes.CDLL(None, use_errno=True).sync_file_range
            sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            return lambda fd: sync_file_range(fd, 0, 0, 2)  # 2: SYNC_FILE_RANGE_WRITE, the whole file
        except (OSError, AttributeError):
            pass
    return lambda fd: None


def _pack_bytes(sizes: list[int], psize: int = 4096) -> int:
    """About how large a pack of records with these payload sizes gets: values above ~2 KB take whole overflow
    pages, smaller ones share leaf pages (counted twice: pages are not full); plus the metadata and branch pages."""
    total = 1 << 20
    for size in sizes:
        value = HEADER.size + size
        total += -(-(value + 16) // psize) * psize if value > 2000 else 2 * (value + 24)
    return total


def writer_lock_path(dst: str | os.PathLike) -> Path:
    """The file a :class:`PackWriter` holds locked (``flock``) while it writes ``<dst>.partial``."""
    return Path(f"{dst}.partial.writer")


def being_written(dst: str | os.PathLike) -> bool:
    """Whether a live process is writing ``<dst>.partial`` now (it holds :func:`writer_lock_path` locked)."""
    import fcntl

    path = writer_lock_path(dst)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _take_writer_lock(dst: Path) -> int:
    """Lock :func:`writer_lock_path` for this writer (the lock goes when the descriptor closes, also at a kill -9).

    Raises:
        FileExistsError: another process holds it: a pack to ``dst`` is being written."""
    import fcntl

    path = writer_lock_path(dst)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip()
        os.close(fd)
        raise FileExistsError(
            f"{str(dst)!r} is being written by another process ({'pid ' + holder if holder else 'a process'} holds "
            f"the lock {str(path)!r}); wait for that pack to finish, or stop it and pass resume=True (CLI: --resume)."
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


class PackWriter:
    """Writes records to ``<dst>.partial`` in index order, committing every ``commit_every`` records or
    ``commit_bytes`` bytes; :meth:`finish` writes the metadata, the completion record, and renames the file.

    ``resume=True`` reopens an existing ``.partial`` and continues after its last committed record (the source
    fingerprint must match). The map grows (doubles) on ``MapFullError``; every ``putmulti`` is checked to have
    stored every record. ``reserve``: the expected file size in bytes, allocated on disk up front (Linux): no block
    allocation at every page fault of the memory map, and an early error when the disk is too small.
    """

    def __init__(
        self,
        dst: str | os.PathLike,
        fingerprint: str,
        resume: bool = False,
        commit_every: int = 1000,
        commit_bytes: int = 64 << 20,
        map_size: int = 1 << 30,
        reserve: int = 0,
    ) -> None:
        lmdb = require("lmdb")
        self.dst = Path(dst)
        self.partial = Path(f"{self.dst}.partial")
        self._lock_fd = -1
        if self.dst.exists():
            raise FileExistsError(
                f"{str(self.dst)!r} already exists; remove it or choose another destination."
            )
        self._lock_fd = _take_writer_lock(self.dst)  # before the .partial is looked at: one writer at a time
        if self.partial.exists() and not resume:
            self._release()
            raise FileExistsError(
                f"{str(self.partial)!r} is an interrupted pack; pass resume=True (CLI: --resume) to continue it, or "
                "delete it to start over."
            )
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        self._lmdb = lmdb
        # Commits are not fsynced: a killed process leaves its last commit in the page cache and resumes from it;
        # the finished pack is fsynced before its atomic rename (after a power loss, restart an unfinished pack).
        # writemap: records are copied straight into the file's pages (no second copy by write() at each commit;
        # measured 1.3-1.7x faster packing); the file is sparse at the map size until finish() trims it.
        try:
            self.env = lmdb.open(str(self.partial), subdir=False, map_size=max(map_size, 2 * reserve), max_dbs=2,
                                 lock=True, sync=False, metasync=False, writemap=True)  # fmt: skip
        except Exception:
            self._release()
            raise
        try:
            _reserve_disk(self.partial, reserve)
        except OSError:
            self.env.close()
            self._release()
            raise
        # each commit starts writing its pages to disk, so the fsync at finish() waits for little and dirty pages
        # do not pile up
        self._fd, self._writeback = os.open(self.partial, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)), _writeback()
        self.records = self.env.open_db(RECORDS)
        self.meta = self.env.open_db(META)
        self.commit_every, self.commit_bytes = commit_every, commit_bytes
        self.next_index = 0
        with self.env.begin(db=self.meta) as txn:
            stored = txn.get(b"fingerprint")
            progress = txn.get(b"progress")
            state = txn.get(b"pack_state")
        if stored is not None and stored.decode() != fingerprint:
            self.close()
            raise ValueError(
                f"{str(self.partial)!r} was packed from a different source (fingerprint {stored.decode()} != "
                f"{fingerprint}); delete it to start over."
            )
        if progress is not None:
            self.next_index = int(progress)
        #: the packer's own progress, stored with every commit (``pack_image_folder``: the next source file and
        #: the bad files skipped so far), so a resume keeps what the policy decided
        self.state: dict[str, Any] = {} if state is None else require("msgpack").unpackb(state, raw=False)
        self._fingerprint = fingerprint
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0

    def add(self, payload: bytes, label: int = -1, codec: str = "raw") -> None:
        self.add_value(encode_record(payload, label, codec))

    def add_value(self, value: bytes | bytearray) -> None:
        """Add an already encoded record value (:func:`encode_record`)."""
        self.add_values([value])

    def add_values(self, values: list[bytes] | list[bytearray], auto_commit: bool = True) -> None:
        """Add already encoded record values, in order; commits once ``commit_every`` records or ``commit_bytes``
        bytes are pending (``auto_commit=False``: only when :meth:`commit` is called, for a caller whose
        :attr:`state` must describe exactly the committed records)."""
        start = self.next_index + len(self._pending)
        self._pending.extend(zip(map(KEY.pack, range(start, start + len(values))), values, strict=True))
        self._pending_bytes += sum(map(len, values))
        if auto_commit and (len(self._pending) >= self.commit_every or self._pending_bytes >= self.commit_bytes):
            self.commit()

    def commit(self, force: bool = False) -> None:
        """Store the pending records, the progress and :attr:`state` in one transaction (retried with a larger map
        if full); ``force``: commit the state even without pending records."""
        if not self._pending and not force:
            return
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    consumed, added = (
                        txn.cursor(db=self.records).putmulti(self._pending, append=True) if self._pending else (0, 0)
                    )
                    if added != len(self._pending):
                        raise RuntimeError(
                            f"LMDB stored {added} of {len(self._pending)} records at index {self.next_index}: "
                            "keys out of order? The pack is left at its last commit."
                        )
                    txn.put(b"fingerprint", self._fingerprint.encode(), db=self.meta)
                    txn.put(b"progress", str(self.next_index + added).encode(), db=self.meta)
                    if self.state:
                        txn.put(b"pack_state", require("msgpack").packb(self.state, use_bin_type=True), db=self.meta)
                break
            except self._lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
        self._writeback(self._fd)
        self.next_index += len(self._pending)
        self._pending, self._pending_bytes = [], 0

    def finish(self, meta: dict[str, Any]) -> Path:
        """Commit, write ``meta`` (msgpack values), the length and the completion record; rename atomically."""
        self.commit()
        msgpack = require("msgpack")
        with self.env.begin(write=True, db=self.meta) as txn:
            for name, value in meta.items():
                txn.put(name.encode(), msgpack.packb(value, use_bin_type=True))
            txn.put(b"schema_version", str(SCHEMA_VERSION).encode())
            txn.put(b"length", str(self.next_index).encode())
            txn.put(b"complete", msgpack.packb({"length": self.next_index}))
            txn.put(b"meta_crc", str(meta_crc(txn.cursor())).encode())
        used = (self.env.info()["last_pgno"] + 1) * self.env.stat()["psize"]
        self.env.sync(True)
        self.close()
        if os.path.getsize(self.partial) > used:  # writemap grew the file to the map size: trim the unused tail
            os.truncate(self.partial, used)
            fd = os.open(self.partial, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(self.partial, self.dst)
        directory = os.open(self.dst.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power loss
        finally:
            os.close(directory)
        lock = Path(f"{self.partial}-lock")
        if lock.exists():
            lock.unlink()
        writer_lock_path(self.dst).unlink(missing_ok=True)  # a writer that opens it now finds the pack finished
        self._release()
        return self.dst

    def _release(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def close(self) -> None:
        self.env.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._release()
