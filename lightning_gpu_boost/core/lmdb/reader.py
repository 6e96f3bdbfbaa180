"""Reading LMDB packs (the format of :mod:`~lightning_gpu_boost.core.lmdb.format`): :class:`PackReader` (records by
key, checksum checked on every read, one environment per file and process, keyed by the file's identity), the
fork gate that keeps forked workers from hanging, and the block read-ahead."""

from __future__ import annotations

import itertools
import os
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

from lightning_gpu_boost._imports import require
from lightning_gpu_boost.core.lmdb.format import (
    _CRC32,
    _HEADER_SIZE,
    _UNPACK_HEADER,
    CODEC_NAMES,
    CRC_PREFIX,
    KEY,
    META,
    READABLE_VERSIONS,
    RECORDS,
    SCHEMA_VERSION,
    CorruptRecordError,
    IncompletePackError,
    Record,
    StalePackError,
    _crc32_function,
    decode_record,
    meta_crc,
)
from lightning_gpu_boost.core.lmdb.page_cache import _PREFETCHED, _prefetch_if_small, readahead_chunk
from lightning_gpu_boost.core.lmdb.pages import _map_base, _tree_levels, record_extents
from lightning_gpu_boost.core.lmdb.writer import being_written

__all__ = ['CHECK_EVERY', 'FORK_WAIT_S', 'PackReader', 'close_readers', 'file_identity', 'wait_for_read_ahead']

# -------------------------------------------------------------------------------------------------- reader


#: (pid, real path) -> (environment, its databases, the identity of the file it maps: :func:`file_identity`)
_ENVS: dict[tuple[int, str], tuple[Any, dict[bytes, Any], tuple[int, ...]]] = {}
#: environments of files replaced at their path while open (kept open: readers of the old file may still read it)
_REPLACED: list[Any] = []
_ENVS_LOCK = threading.Lock()  # reader threads (DALI's read-ahead) may open the same file at once


_PID = [os.getpid()]  # this process's id, kept current after a fork: readers compare it at each read

_new = tuple.__new__  # Record(...) without its __new__'s Python call: the read path below
_CODEC_NAMES_GET = CODEC_NAMES.get

#: a reader checks every this many reads that its pack is still the file at its path (one ``stat``)
CHECK_EVERY = 4096

#: how long a fork waits for this process's threads to finish the LMDB calls they are in (seconds)
FORK_WAIT_S = 30.0


class _ForkGate:
    """Counts the LMDB calls this process's threads are in, so that a fork waits for them and starts no new one.

    py-lmdb (3.x) counts each call that runs without the GIL (every ``get``, cursor step, ``stat``) and its
    ``Environment.close()`` waits for that count to reach 0. A child forked while another thread is inside such a
    call inherits a count that never drops (the thread is not copied), so closing the inherited environment, which
    it must do before it can open the file again, waited forever: every DataLoader worker forked while a DALI
    reading thread or the read-ahead thread read the same pack hung (``tests/core/test_lmdb_fork.py``).

    Entering and leaving are two ``next()`` calls on :class:`itertools.count` (atomic, no lock): a read pays
    ~0.3 us, not the ~1.4 us of a lock and a condition (``benchmarks/diagnostics/fork_gate.py``). Not reentrant: a
    thread inside must not enter again (it would wait for a fork that waits for it, :data:`FORK_WAIT_S`)."""

    def __init__(self) -> None:
        import itertools

        self.entered, self.left = itertools.count(), itertools.count()
        self.cond = threading.Condition(threading.Lock())
        self.forking = False

    def busy(self) -> int:
        entered, left = (int(repr(c)[6:-1]) for c in (self.entered, self.left))  # "count(N)"; read without a step
        return entered - left

    def wait_turn(self) -> None:
        """Entered while a fork waits: step back out, wait for the fork to be done, enter again."""
        while self.forking:
            next(self.left)
            with self.cond:
                self.cond.notify_all()
                self.cond.wait_for(lambda: not self.forking)
            next(self.entered)

    def leave_while_forking(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def __enter__(self) -> None:
        next(self.entered)
        if self.forking:
            self.wait_turn()

    def __exit__(self, *exc: Any) -> None:
        next(self.left)
        if self.forking:
            self.leave_while_forking()


_GATE = [_ForkGate()]
#: ``False`` in a child whose parent forked while a thread was still inside an LMDB call (:data:`FORK_WAIT_S`)
_QUIET_AT_FORK = [True]
_INHERITED: list[tuple[Any, dict[bytes, Any]]] = []  # the parent's environments, closed at the first open here


def _before_fork() -> None:
    gate = _GATE[0]
    with gate.cond:
        gate.forking = True
        _QUIET_AT_FORK[0] = gate.cond.wait_for(lambda: not gate.busy(), timeout=FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    gate = _GATE[0]
    with gate.cond:
        gate.forking = False
        gate.cond.notify_all()


def _close_inherited() -> None:
    """After a fork, in the child: fresh locks, and the parent's environments set aside, to be closed on the first
    open in this process (py-lmdb refuses to open a file already open in the process, and LMDB handles must not be
    used across fork). A child that never opens a pack (a pool that encodes images) never touches them."""
    global _CLOSE_LOCK, _ADVISOR_LOCK, _ENVS_LOCK
    _PID[0] = os.getpid()
    _GATE[0] = _ForkGate()
    _CLOSE_LOCK, _ADVISOR_LOCK = threading.Lock(), threading.Lock()  # the parent's read-ahead thread may have held one
    _ENVS_LOCK = threading.Lock()
    _INHERITED.extend(_ENVS.values())
    _ENVS.clear()


def _close_inherited_envs() -> None:
    """Close the environments inherited from the parent (under ``_ENVS_LOCK``), or say why they cannot be."""
    if not _INHERITED:
        return
    if not _QUIET_AT_FORK[0]:
        raise RuntimeError(
            f"This process was forked while another thread of its parent had been inside an LMDB read for over "
            f"{FORK_WAIT_S:g} s (lmdb_reader.FORK_WAIT_S); the pack it inherited cannot be closed, nor opened again. "
            "Start the workers with multiprocessing_context='spawn' or 'forkserver' (DataLoader argument), or look "
            "at the storage: one read should not take that long."
        )
    for env, *_ in _INHERITED:
        try:
            env.close()
        except Exception:
            pass
    _INHERITED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_close_inherited)


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    """``madvise(addr, length, advice)`` from the C library (Linux), else ``None``."""
    import sys

    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


_MADVISE = _libc_madvise()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_WILLNEED, _MADV_POPULATE_READ = 3, 22  # POPULATE_READ: Linux 5.14+ (EINVAL before: then left out)


class _Advisor:
    """One daemon thread per process that finds and asks for the spans of :meth:`PackReader.will_need`, so that the
    caller (the loader's sampler, a DALI feeder, a training loop reading one record at a time) never waits on them:
    a ``WILLNEED`` call allocates the pages and queues their reads itself, blocking while the disk's queue is full,
    which in the asking thread costs a cold pass much of its time (``benchmarks/diagnostics/block_read_ahead.py``).
    Spans come from the records' places (:func:`record_extents`), read once with the B-tree's pages, so finding a
    block's span touches none of its records; lookups only where those are unknown. Requests waiting together
    are all queued with the disk (``WILLNEED``) before any is mapped (``POPULATE_READ``, for spans asked with
    ``populate``: this process's page tables filled ahead of its reads)."""

    def __init__(self) -> None:
        import queue

        self.pid = os.getpid()
        self.queue: Any = queue.Queue()
        self.populate_ok = True
        threading.Thread(target=self._run, name="lightning-gpu-boost-readahead", daemon=True).start()

    def _run(self) -> None:
        import queue

        while True:
            asked = [self.queue.get()]
            while True:
                try:
                    asked.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._advise(asked)
            except Exception:  # reading ahead only saves time: a closed reader or an unmapped span is not fatal
                pass
            finally:
                for _ in asked:
                    self.queue.task_done()

    def _advise(self, asked: list[tuple[Any, int, int, bool]]) -> None:
        madvise, mapped = _MADVISE, []
        if madvise is None:
            return
        for reader in {id(r): r for r, *_ in asked}.values():
            with _CLOSE_LOCK:
                reader._read_tree_ahead()
        for reader, lo, hi, populate in asked:
            with _CLOSE_LOCK:  # close_readers waits: no environment is closed under a lookup
                span = reader._span(lo, hi)
            if span is None:
                continue
            start, end, chunk = span
            for a in range(start, end, chunk):  # one request per chunk: the kernel reads at most a chunk per request
                madvise(a, min(chunk, end - a), _MADV_WILLNEED)
            if populate:
                mapped.append((start, end))
        for start, end in mapped:
            if self.populate_ok and madvise(start, end - start, _MADV_POPULATE_READ) != 0:
                import ctypes
                import errno

                if ctypes.get_errno() == errno.EINVAL:  # a kernel before 5.14: reads fault their pages as before
                    self.populate_ok = False


_ADVISOR: list[_Advisor] = []
_ADVISOR_LOCK = threading.Lock()
_CLOSE_LOCK = threading.Lock()  # held while the advisor looks a span up, and while an environment is closed


def _advisor() -> _Advisor:
    """This process's :class:`_Advisor` (a new one after a fork: threads do not survive it)."""
    with _ADVISOR_LOCK:
        if not _ADVISOR or _ADVISOR[0].pid != os.getpid():
            _ADVISOR[:] = [_Advisor()]
        return _ADVISOR[0]


def wait_for_read_ahead() -> None:
    """Block until every read asked for in this process so far (:meth:`PackReader.will_need`) has been handed to
    the kernel (not until its data has arrived); for tests and benchmarks."""
    with _ADVISOR_LOCK:
        advisor = _ADVISOR[0] if _ADVISOR and _ADVISOR[0].pid == os.getpid() else None
    if advisor is not None:
        advisor.queue.join()


def _address(buffer: Any) -> int:
    """The memory address of a (read-only) buffer: a record's place in the memory map."""
    import numpy as np

    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)


def file_identity(path: str | os.PathLike) -> tuple[int, int, int, int]:
    """What tells a file from another put at the same path: device, inode, size and modification time (ns)."""
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _shared_env(path: str, readahead: bool) -> tuple[Any, dict[bytes, Any], tuple[int, ...]]:
    """One read-only environment per file and process (py-lmdb refuses a second open of the same file), keyed by
    the file's identity: a pack replaced at the same path (removed and packed again) is opened afresh, never
    served from the environment of the file it replaced."""
    lmdb = require("lmdb")
    real = os.path.realpath(path)
    cache_key = (os.getpid(), real)
    with _ENVS_LOCK:
        identity = file_identity(real)
        entry = _ENVS.get(cache_key)
        replaced = None
        if entry is not None and entry[2] != identity:
            replaced = _ENVS.pop(cache_key)[0]  # another file now (or the same one rewritten in place)
            _PREFETCHED.discard(real)
        if entry is None or entry[2] != identity:
            _close_inherited_envs()
            with _GATE[0]:
                try:
                    entry = _open_env(lmdb, path, readahead, cache_key, identity)
                except lmdb.Error:
                    if replaced is None:
                        raise
                    # the same inode rewritten in place: LMDB opens a file once per process, and the old map's
                    # contents changed under it anyway; its readers raise StalePackError at their next check
                    replaced.close()
                    replaced = None
                    entry = _open_env(lmdb, path, readahead, cache_key, identity)
            if replaced is not None:
                _REPLACED.append(replaced)  # a new file at the path: the old one's readers keep their map
        return entry


def _open_env(lmdb: Any, path: str, readahead: bool, cache_key: tuple[int, str],
              identity: tuple[int, ...]) -> tuple[Any, dict[bytes, Any], tuple[int, ...]]:  # fmt: skip
    env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=readahead, max_dbs=2,
                    max_readers=1024)  # fmt: skip
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if readahead:
        _prefetch_if_small(path)
    if os.path.getsize(path) < needed:  # reading past the end of a memory map kills the process (SIGBUS)
        env.close()
        raise CorruptRecordError(
            f"{path!r} is truncated: {os.path.getsize(path)} bytes, its pages need {needed}. Copy it again or repack."
        )
    _ENVS[cache_key] = (env, {name: env.open_db(name, create=False) for name in (RECORDS, META)}, identity)
    return _ENVS[cache_key]


def close_readers(path: str | os.PathLike) -> None:
    """Close this process's read-only environment of ``path`` (e.g. before deleting or replacing the file)."""
    _PREFETCHED.discard(os.path.realpath(path))  # opened again, it is asked for again (e.g. after a cache drop)
    entry = _ENVS.pop((os.getpid(), os.path.realpath(path)), None)
    if entry is not None:
        with _CLOSE_LOCK, _GATE[0]:  # not under the read-ahead thread's lookup, nor across a fork
            entry[0].close()


class PackReader:
    """Read-only access to a complete pack, opened lazily per process (safe under fork and spawn: the handle
    is dropped when pickled and reopened after a fork), ``readonly=True, lock=False``, readahead on.

    Raises:
        FileNotFoundError: no such file.
        IncompletePackError: the pack was interrupted (names the resume command).
        ValueError: an unknown schema version.
    """

    def __init__(self, path: str | os.PathLike, check_crc: bool = True, readahead: bool = True) -> None:
        self.path = str(path)
        self.check_crc = check_crc
        self.readahead = readahead
        self._env: Any = None
        self._pid = -1
        self._local = threading.local()
        self._reads = itertools.count(1)
        with self._begin(META) as txn, _GATE[0]:  # opened first: the gate is not reentrant
            complete, version, length = txn.get(b"complete"), txn.get(b"schema_version"), txn.get(b"length")
            stored_crc = txn.get(b"meta_crc")
            computed_crc = meta_crc(txn.cursor()) if stored_crc is not None else None
            complete, version, length = (None if v is None else bytes(v) for v in (complete, version, length))
            stored_crc = None if stored_crc is None else bytes(stored_crc)
        if complete is None:
            if not self.path.endswith(".partial"):  # a pack gets its name only once complete: this one was damaged
                raise CorruptRecordError(
                    f"{self.path!r} is damaged: its metadata reads as an unfinished pack, but `pack` names a file only "
                    "once it is complete (damaged LMDB meta pages, or a copy of a pack's .partial file). Repack the "
                    "source or restore the file."
                )
            dst = self.path[: -len(".partial")]
            if being_written(dst):
                raise IncompletePackError(f"{self.path!r} is being written by another process now; wait for that "
                                          "pack to finish.")  # fmt: skip
            raise IncompletePackError(
                f"{self.path!r} is an incomplete pack (interrupted); resume it with "
                f"`lightning-gpu-boost pack SRC {dst} --resume`."
            )
        if version is None or not version.isdigit() or int(version) not in READABLE_VERSIONS:
            raise CorruptRecordError(
                f"{self.path!r} has schema version {version!r}; this reader knows versions "
                f"{', '.join(map(str, READABLE_VERSIONS))} (damaged metadata, or a pack from a newer release)."
            )
        self.version = int(version)
        if self.version >= 2 and (stored_crc is None or not stored_crc.isdigit() or int(stored_crc) != computed_crc):
            raise CorruptRecordError(
                f"The metadata of {self.path!r} (classes, length, ...) is corrupt: its CRC32 does not match. Repack "
                "the source or restore the file."
            )
        if length is None or not length.isdigit():
            raise CorruptRecordError(f"{self.path!r} has no valid length in its metadata.")
        self.length = int(length)

    def _open(self) -> Any:
        if self._env is None or self._pid != _PID[0]:
            if not os.path.exists(self.path):
                partial = f"{self.path}.partial"
                hint = f"; {partial!r} is an interrupted pack: resume it with `lightning-gpu-boost pack SRC {self.path} --resume`" if os.path.exists(partial) else ""  # fmt: skip
                if hint and being_written(self.path):
                    hint = f"; {partial!r} is being written by another process now: wait for that pack to finish"
                raise FileNotFoundError(f"No LMDB pack at {self.path!r}{hint}.")
            env, dbs, identity = _shared_env(self.path, self.readahead)
            _crc32_function()  # the CRC-32 that reads check records with (ISA-L's where installed), in this process
            known = self.__dict__.get("identity")
            if known is not None and identity != known:
                raise self._stale("another file is at that path now")
            self._env, self._dbs, self.identity = env, dbs, identity
            self._pid = _PID[0]
            self._local = threading.local()  # read transactions of this process's threads (none from a parent)
        return self._env

    def _stale(self, what: str) -> StalePackError:
        return StalePackError(
            f"The pack {self.path!r} was replaced after this reader opened it ({what}): its metadata and records "
            "would no longer agree. Build the dataset or DataModule again to read the new pack."
        )

    def check_current(self) -> None:
        """Raise :class:`StalePackError` where the file at the pack's path is no longer the one this reader maps
        (checked on opening in each process, and every :data:`CHECK_EVERY` reads)."""
        try:
            identity = file_identity(self.path)
        except FileNotFoundError:
            raise self._stale("the file was removed") from None
        if self.__dict__.get("identity") is not None and identity != self.identity:
            raise self._stale("another file is at that path now")

    def _begin(self, name: bytes) -> Any:
        env = self._open()
        return env.begin(db=self._dbs[name], buffers=True)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_env": None, "_pid": -1, "_dbs": None, "_local": None, "_paths": None,
                "_tree_pid": None, "_extents": None, "_base": None}

    def source_path(self, index: int) -> str:
        """Record ``index``'s file, relative to the packed folder (``meta("paths")``; packs before it: the
        record's number)."""
        paths = self.__dict__.get("_paths")
        if paths is None:
            paths = self._paths = self.meta("paths") or []
        return paths[index] if 0 <= index < len(paths) else f"record {index} of {self.path}"

    def __len__(self) -> int:
        return self.length

    def meta(self, name: str) -> Any:
        with self._begin(META) as txn, _GATE[0]:
            value = txn.get(name.encode())
            return None if value is None else require("msgpack").unpackb(bytes(value), raw=False)

    def _txn(self) -> Any:
        """This thread's read transaction, kept open: the pack never changes (half the cost of a read)."""
        if self._pid != _PID[0]:  # first use in this process (a worker after fork, or unpickled under spawn)
            self._open()
        try:
            return self._local.txn
        except AttributeError:
            self._local.txn = self._env.begin(db=self._dbs[RECORDS], buffers=True)
            return self._local.txn

    def read(self, index: int, decode: Callable[[Record], Any] = lambda r: bytes(r.payload)) -> Any:
        """Decode record ``index`` (zero-copy payload: a view of the memory map, valid inside ``decode``)."""
        if not 0 <= index < self.length:
            raise IndexError(f"Index {index} is out of range for {self.path!r} with {self.length} records.")
        if self._pid == _PID[0]:  # this thread's transaction, looked up inline: this is the hot path
            try:
                txn = self._local.txn
            except AttributeError:
                txn = self._txn()
        else:
            txn = self._txn()
        gate = _GATE[0]
        if not next(self._reads) % CHECK_EVERY:  # a file replaced under a long-lived reader raises, naming it
            self.check_current()
        next(gate.entered)  # ``with gate``, inlined: this is the hot path
        try:
            if gate.forking:
                gate.wait_turn()
            value = txn.get(KEY.pack(index))
        finally:
            next(gate.left)
            if gate.forking:
                gate.leave_while_forking()
        if value is None:
            raise CorruptRecordError(f"Record {index} is missing from {self.path!r}.")
        # the usual record (this version, a known codec, its length and CRC right), checked inline: a 4 KB read is
        # mostly Python calls; anything else takes decode_record's general checks, which raise naming the fault
        try:
            version, codec, label, length, crc = _UNPACK_HEADER(value)
        except struct.error:  # shorter than a header: decode_record says so
            return decode(decode_record(index, value, self.check_crc))
        payload = value[_HEADER_SIZE:]
        name = _CODEC_NAMES_GET(codec)
        if version == SCHEMA_VERSION and len(payload) == length and name is not None:
            if not self.check_crc or _CRC32[0](payload, _CRC32[0](value[:CRC_PREFIX])) == crc:
                return decode(_new(Record, (index, name, label, payload)))
        return decode(decode_record(index, value, self.check_crc))

    @property
    def read_whole(self) -> bool:
        """Whether the whole pack was asked into the page cache when it was opened (it fits in memory: see
        :func:`~lightning_gpu_boost.core.lmdb.page_cache._prefetch_if_small`), which leaves :meth:`will_need`
        nothing to do."""
        return os.path.realpath(self.path) in _PREFETCHED

    def will_need(self, lo: int, hi: int, populate: bool = False) -> bool:
        """Start reading records ``lo .. hi - 1`` into the page cache in the background, as one large read (Linux
        ``madvise(MADV_WILLNEED)`` over their span of the memory map, in :func:`readahead_chunk` pieces; records are
        stored in key order, so a run of consecutive records is one stretch of the file). For block-shuffled orders
        on a cold cache or network storage: the block is on its way while its first records are decoded. The kernel's
        read-around of each fault stays on (turning it off, ``MADV_RANDOM``, reads block-shuffled epochs slower:
        ``benchmarks/bigger_than_ram.py`` measures it).

        The span is found and asked for by a background thread (:class:`_Advisor`), so the caller goes on at once;
        with a process's first request it also asks for the B-tree's own pages and reads where every record lies
        (:meth:`_read_tree_ahead`), so that spans are found without touching the records.
        ``populate``: also map the span into this process's page tables once read (``MADV_POPULATE_READ``, Linux
        5.14+), for a process that reads the records itself (no loader workers). Returns whether a read was asked
        for (not on other systems, nor for an empty span); the thread skips a span it cannot find or over 1 GiB."""
        lo, hi = max(0, lo), min(self.length, hi)
        if hi <= lo or _MADVISE is None:
            return False
        _advisor().queue.put((self, lo, hi, bool(populate)))
        return True

    def _read_tree_ahead(self) -> int:
        """Once per process: ask for the records' B-tree pages (:func:`tree_pages`), each alone
        (``POSIX_FADV_WILLNEED``), then read the leaf pages for where each record lies (:func:`record_extents`).
        Every lookup walks those pages and they lie outside the blocks asked for: on a cold cache, each first touch
        was a fault that read the kernel's read-around (8 MiB on the H100 machine) in the reading thread, the first
        windows of a block-shuffled pass 4-8x slower than the rest (``benchmarks/diagnostics/block_pass_windows.py``);
        and with the records' places known, :meth:`_span` finds a block without touching its records. Returns the
        pages asked for."""
        if self.__dict__.get("_tree_pid") == _PID[0] or not hasattr(os, "posix_fadvise"):
            return 0
        self._tree_pid = _PID[0]
        self._extents, self._base = None, None
        env = self._open()
        with _GATE[0], env.begin(buffers=False) as txn:  # the main database: the records database's own record
            record = txn.get(RECORDS)
            page_size = env.stat()["psize"]
        branches, leaves = _tree_levels(self.path, record, page_size) if record is not None else ([], [])
        pages = sorted(branches + leaves)
        if not pages:
            return 0
        fd = os.open(self.path, os.O_RDONLY)
        try:
            start = prev = pages[0]
            for pgno in pages[1:] + [None]:  # runs of consecutive pages, one request each
                if pgno is not None and pgno == prev + 1:
                    prev = pgno
                    continue
                os.posix_fadvise(fd, start * page_size, (prev - start + 1) * page_size, os.POSIX_FADV_WILLNEED)
                if pgno is not None:
                    start = prev = pgno
        finally:
            os.close(fd)
        base = _map_base(self.path)
        if base is not None:
            self._extents, self._base = record_extents(self.path, leaves, page_size, self.length), base
        return len(pages)

    def _span(self, lo: int, hi: int) -> tuple[int, int, int] | None:
        """The page-aligned start, the end and the readahead chunk of records ``lo .. hi - 1`` in this process's
        memory map, or ``None``: from the records' places (:meth:`_read_tree_ahead`) where known, else by reading
        the first and last records (py-lmdb touches the values it returns)."""
        extents = self.__dict__.get("_extents") if self.__dict__.get("_tree_pid") == _PID[0] else None
        if extents is not None:
            start, end = self._base + int(extents[lo, 0]), self._base + int(extents[hi - 1].sum())
        else:
            txn = self._txn()
            with _GATE[0]:
                first, last = txn.get(KEY.pack(lo)), txn.get(KEY.pack(hi - 1))
            if first is None or last is None:
                return None
            start, end = _address(first), _address(last) + len(last)
        start -= start % _PAGE
        if not 0 < end - start <= 1 << 30:
            return None
        chunk = self.__dict__.get("_chunk")
        if chunk is None:
            chunk = self._chunk = readahead_chunk(self.path)
        return start, end, chunk

    def iter_records(self, check_crc: bool = True) -> Iterator[Record]:
        with self._begin(RECORDS) as txn:
            items = iter(txn.cursor())
            while True:
                with _GATE[0]:  # each step, not the whole walk: the caller may fork between records
                    item = next(items, None)
                if item is None:
                    return
                yield decode_record(KEY.unpack(bytes(item[0]))[0], item[1], check_crc)

