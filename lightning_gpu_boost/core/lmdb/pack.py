"""The packers: :func:`pack_image_folder` (checked reads in threads, bad files skipped and listed by position, files
that are no regular files never opened, shards) and :func:`pack_dataset`."""

from __future__ import annotations

import os
import stat as stat_module
import struct
from pathlib import Path
from typing import Any, Literal

from lightning_gpu_boost.core.lmdb.format import (
    CODECS,
    CRC_PREFIX,
    HEADER,
    MANIFEST_FORMAT,
    SCHEMA_VERSION,
    pack_sample,
    record_crc,
    shard_path,
)
from lightning_gpu_boost.core.lmdb.reader import PackReader
from lightning_gpu_boost.core.lmdb.writer import PackWriter, _pack_bytes

__all__ = ['WINDOW_BYTES', 'bad_samples_report_path', 'pack_dataset', 'pack_image_folder', 'pack_workers']

# -------------------------------------------------------------------------------------------------- packers


# reading threads of a pack, by the mean file size: for small files from the page cache more threads only fight
# over the GIL, and LMDB's stores (which release the GIL at every record) wait for a reading thread; larger files
# gain from two (benchmarks/diagnostics/lmdb_pack_workers.py measures both). Pass ``workers`` for filesystems where
# each read waits on I/O.
def pack_workers(sizes: list[int]) -> int:
    """Reading threads for files of these sizes: none (read between commits) for files of less than 32 KiB on
    average, else 2."""
    return 0 if sizes and sum(sizes) < (32 << 10) * len(sizes) else 2


def _scan_sources(
    root: str | os.PathLike, files: list[str], stats: dict[str, os.stat_result] | None = None
) -> tuple[str, list[int]]:
    """The fingerprint of a source tree (its files' relative paths, sizes and modification times) and the files'
    sizes, from one ``stat`` each (taken from ``stats`` where the tree scan kept it; -1 for a file that cannot be
    stat'ed: a dangling link, checked when read)."""
    import hashlib

    prefix = os.path.join(str(root), "")
    lines, sizes = [], []
    known = stats or {}
    for path in files:
        try:
            stat = known.get(path) or os.stat(path)
            size, mtime = stat.st_size, stat.st_mtime_ns
        except OSError:
            size, mtime = -1, 0
        rel = _rel_path(path, root, prefix)
        lines.append(f"{rel}\0{size}\0{mtime}\n")
        sizes.append(size)
    # surrogateescape: file names that are not UTF-8 are packed and fingerprinted as their bytes
    return hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape")).hexdigest()[:32], sizes


#: a pack's window (read ahead while the one before is stored, then committed) holds at most this many bytes of
#: records: its buffer is one of two reused for the whole pack. Memory the process has not touched before costs a
#: page fault per 4 KiB at first use (a fresh 100 KB buffer per record costs about half of what reading,
#: checksumming and storing the file cost), so two small windows reused beat a fresh buffer per record or window.
WINDOW_BYTES = 8 << 20


class _Arenas:
    """Two buffers reused window after window (one read ahead while the other is stored): each window's records
    are read into slices of one of them instead of fresh memory."""

    def __init__(self) -> None:
        self._buffers = [bytearray(), bytearray()]
        self._turn = 0

    def slices(self, sizes: list[int]) -> list[memoryview | None]:
        """A slice of ``HEADER.size + size`` bytes per record (``None`` for a size below 0: a file that appeared
        since the scan) in the next buffer, grown when too small; valid until that buffer's next turn, two windows
        later (by then its records are committed)."""
        need = sum(HEADER.size + s for s in sizes if s >= 0)
        k, self._turn = self._turn, 1 - self._turn
        if len(self._buffers[k]) < need:
            self._buffers[k] = bytearray(need)
        view, out, at = memoryview(self._buffers[k]), [], 0
        for size in sizes:
            if size < 0:
                out.append(None)
                continue
            out.append(view[at : at + HEADER.size + size])
            at += HEADER.size + size
        return out


def _windows(sizes: list[int], start: int, most: int, most_bytes: int | None = None) -> list[tuple[int, int]]:
    """``(lo, hi)`` windows from ``start``: at most ``most`` records and ``most_bytes`` bytes each (at least one;
    default :data:`WINDOW_BYTES`)."""
    most_bytes = WINDOW_BYTES if most_bytes is None else most_bytes
    out, lo = [], start
    while lo < len(sizes):
        hi, total = lo, 0
        while hi < len(sizes) and hi - lo < most and (hi == lo or total + max(0, sizes[hi]) <= most_bytes):
            total += max(0, sizes[hi]) + HEADER.size
            hi += 1
        out.append((lo, hi))
        lo = hi
    return out


def _read_records(
    items: list[tuple[str, int, int]],
    check: str | None,
    resize: tuple[int, int] | None = None,
    outs: list[memoryview | None] | None = None,
) -> list[bytearray | memoryview | tuple[str, str]]:
    outs = outs if outs is not None else [None] * len(items)
    return [_read_record(path, label, size, check, resize, out) for (path, label, size), out in zip(items, outs, strict=True)]  # fmt: skip


def _read_record(
    path: str,
    label: int,
    size: int,
    check: str | None = "structure",
    resize: tuple[int, int] | None = None,
    out: memoryview | None = None,
) -> bytearray | memoryview | tuple[str, str]:
    """The record value of a file of ``size`` bytes (from the fingerprint's ``stat``), built where it is read (a
    reading thread): header space, then the bytes read straight into place, then the header with the CRC32
    (:func:`~lightning_gpu_boost.core.lmdb.format.record_crc`, which lets go of the GIL on large buffers). Plain
    ``os`` calls: ``open()``'s file object costs more than reading a small file. A file that cannot be read, or fails ``check`` (:func:`~lightning_gpu_boost.core.bad_samples.check_image`),
    comes back as ``(path, reason)``. With ``resize = (max_side, quality)``, a larger image is stored resized and
    re-encoded (:func:`~lightning_gpu_boost.core.images.shrink_image`), a smaller one unchanged. ``out``: a buffer of
    ``HEADER.size + size`` bytes to build the value in (:class:`_Arenas`), else a new one."""
    if size < 0:
        try:
            os.stat(path)
        except OSError as err:
            return path, f"cannot read: {err.strerror or err}"
        raise OSError(f"{path!r} appeared while it was packed; pack a quiet source.")
    value: bytearray | memoryview = out if out is not None and len(out) == HEADER.size + size else bytearray(HEADER.size + size)  # fmt: skip
    view = memoryview(value)[HEADER.size :]
    extra = bytearray(1)  # filled only if the file grew since its stat
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:  # no permission, removed since the scan
        return path, f"cannot read: {err.strerror or err}"
    try:
        got = os.readv(fd, [view, extra])
        while got < size:  # a loop: network filesystems may return short reads
            n = os.readv(fd, [view[got:], extra])
            if not n:
                break
            got += n
    except OSError as err:  # an I/O error, a directory named like an image
        return path, f"cannot read: {err.strerror or err}"
    finally:
        os.close(fd)
    if got != size:
        raise OSError(f"{path!r} changed while it was packed ({size} bytes when scanned); pack a quiet source.")
    if check is not None:
        from lightning_gpu_boost.core.bad_samples import check_image

        problem = check_image(view, check)  # type: ignore[arg-type]
        if problem is not None:
            return path, problem
    if resize is not None:
        from lightning_gpu_boost.core.images import shrink_image

        try:
            smaller = shrink_image(view, *resize)
        except Exception as err:  # Pillow raises several types on broken data
            return path, f"cannot decode to resize it: {err}"
        if smaller is not None:
            size = len(smaller)
            value = bytearray(HEADER.size) + smaller
            view = memoryview(value)[HEADER.size :]
    HEADER.pack_into(value, 0, SCHEMA_VERSION, CODECS["raw"], label, size, 0)
    struct.pack_into(">I", value, CRC_PREFIX, record_crc(value))
    return value


OnBad = Literal["skip", "fail"]


def pack_image_folder(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    resume: bool = False,
    workers: int | None = None,
    commit_every: int = 1000,
    progress: bool = True,
    shard_size: int | None = None,
    on_bad: OnBad = "skip",
    check: Literal["structure", "decode", "none"] = "structure",
    max_side: int | None = None,
    quality: int = 90,
    shuffle_seed: int | None = None,
) -> Path:
    """Pack a class-per-folder image tree into one LMDB file, storing each file's bytes unchanged (or, with
    ``max_side``, images whose shorter side is larger resized to it and re-encoded as JPEG at ``quality``).

    Files are read by ``workers`` threads (default :func:`pack_workers`: none for files under 32 KiB on average,
    else 2; 0: in the calling thread, between commits) in windows of ``commit_every``; each window is one
    commit that also records the progress, so ``resume=True`` continues a crashed pack at its last commit.
    Non-image files are skipped and counted (``meta("ignored_files")``).

    Each file is checked where it is read (``check``, see :func:`~lightning_gpu_boost.core.bad_samples.check_image`:
    ``"structure"`` by default, ``"decode"`` for a reduced decode too, ``"none"``). A bad file (empty, not an
    image, truncated, undecodable, unreadable, a dangling link) is, with ``on_bad="skip"``, left out and listed
    with its path and reason in the pack's metadata (``meta("bad_samples")``) and in ``<dst>.bad-samples.json``;
    with ``on_bad="fail"``, the pack stops at once with a :class:`~lightning_gpu_boost.core.bad_samples.BadSampleError`
    naming it (resume after fixing it). Records stay numbered ``0..n-1``; ``meta("paths")`` holds each record's
    path relative to ``src``.

    With ``shard_size``, records go to ``<dst>-shard-00000``, ``<dst>-shard-00001``... (complete packs of at
    most ``shard_size`` source files each) and ``dst`` becomes a JSON manifest naming them, written last;
    ``resume`` skips finished shards. :func:`open_pack` and :class:`~lightning_gpu_boost.datamodules.LMDBDataModule`
    read either form.

    ``max_side`` (as FFCV's ``max_resolution``): images whose shorter side exceeds it are decoded in the reading
    threads (JPEG at a reduced DCT scale), turned upright, resized so the shorter side is ``max_side`` and
    re-encoded; smaller images keep their bytes. The settings are in ``meta("max_side")``/``meta("quality")`` and in
    the source fingerprint (a resume with other settings is refused). Training crops from the smaller images, so
    pick ``max_side`` at least the crop size the model sees (e.g. 256 for 224 crops).

    ``shuffle_seed``: records in a random order (a permutation of the scanned files by that seed) instead of class
    by class, so that a block-shuffled read (:class:`~lightning_gpu_boost.core.block_shuffle.BlockShuffleSampler`)
    mixes classes in every batch as a full shuffle does. Recorded in ``meta("shuffle_seed")``; the fingerprint
    follows the order, so a resume with another seed is refused.

    Raises:
        FileNotFoundError, ValueError: from the tree scan (missing root, empty tree, empty class folder), a bad
            argument, or a ``dst`` whose folder is missing or takes no new file (checked before anything is read).
        FileExistsError: ``dst`` exists, or an interrupted pack exists and ``resume`` is False.
        BadSampleError: a bad file with ``on_bad="fail"``.
    """
    from lightning_gpu_boost import _checks as checks

    checks.check_choice("on_bad", on_bad, ("skip", "fail"))
    checks.check_choice("check", check, ("structure", "decode", "none"))
    checks.check_int("max_side", max_side, low=8, allow_none=True)
    checks.check_int("quality", quality, low=1, high=100)
    checks.check_int("shuffle_seed", shuffle_seed, low=0, high=2**64 - 1, allow_none=True)
    checks.check_int("workers", workers, low=0, allow_none=True)
    checks.check_int("commit_every", commit_every, low=1)
    checks.check_int("shard_size", shard_size, low=1, allow_none=True)
    checks.check_bool("resume", resume)
    checks.check_writable_file("dst", str(dst), allow_none=False)  # before any file is read
    resize = None if max_side is None else (max_side, quality)
    if shard_size is not None:
        return _pack_shards(src, dst, resume, workers, commit_every, progress, shard_size, on_bad, check, resize,
                            shuffle_seed)  # fmt: skip
    stats: dict[str, os.stat_result] = {}
    unread: list[dict[str, str]] = []
    samples, classes, ignored = _scan(src, shuffle_seed, stats, unread)
    return _pack_files(
        src, dst, samples, _image_meta(classes, ignored, resize, shuffle_seed), resume, workers, commit_every,
        progress, on_bad, check, resize, stats, unread,
    )  # fmt: skip


def _scan(
    src: str | os.PathLike, shuffle_seed: int | None, stats: dict[str, os.stat_result] | None = None,
    unread: list[dict[str, str]] | None = None,
) -> tuple[list, list[str], int]:  # fmt: skip
    """The tree's ``(path, label)`` samples (in a random order by ``shuffle_seed``, else class by class); ``stats``
    is filled with the files' ``os.stat`` results, ``unread`` with the files named like images that are not regular
    files (never opened), as bad-sample entries."""
    from lightning_gpu_boost.core.images import scan_image_folder

    special: list[str] = []
    samples, classes, ignored = scan_image_folder(src, stats, special)
    if unread is not None:
        for path in special:
            try:
                mode = os.stat(path).st_mode
                kind = "a FIFO" if stat_module.S_ISFIFO(mode) else "a socket" if stat_module.S_ISSOCK(mode) else "a device" if stat_module.S_ISCHR(mode) or stat_module.S_ISBLK(mode) else "not a file"  # fmt: skip
            except OSError:
                kind = "not a file"
            unread.append({"path": _relative(path, src), "reason": f"not a regular file ({kind}): never read"})
    if shuffle_seed is not None:
        import numpy as np

        samples = [samples[i] for i in np.random.default_rng(shuffle_seed).permutation(len(samples))]
    return samples, classes, ignored


def _image_meta(
    classes: list[str], ignored: int, resize: tuple[int, int] | None = None, shuffle_seed: int | None = None
) -> dict[str, Any]:
    classes = [_text(name) for name in classes]  # a class folder whose name is not UTF-8 packs, escaped
    meta = {
        "kind": "image_folder",
        "classes": classes,
        "class_to_idx": {name: i for i, name in enumerate(classes)},
        "ignored_files": ignored,
    }
    if resize is not None:
        meta["max_side"], meta["quality"] = resize
    if shuffle_seed is not None:
        meta["shuffle_seed"] = shuffle_seed
    return meta


def _rel_path(path: str, root: str | os.PathLike, prefix: str | None = None) -> str:
    """``path`` relative to ``root``: a slice where it lies under ``prefix`` (``root`` with a trailing separator;
    ``os.path.relpath`` per file costs more than reading a small file), else ``os.path.relpath``."""
    if prefix is not None and path.startswith(prefix) and ".." not in path:
        return path[len(prefix) :]
    return os.path.relpath(path, root)


def _relative(path: str, root: str | os.PathLike, prefix: str | None = None) -> str:
    """:func:`_rel_path` as UTF-8 text, for messages and metadata."""
    return _text(_rel_path(path, root, prefix))


def _text(name: str) -> str:
    """A file or folder name as UTF-8 text, one to one: a UTF-8 name without a backslash as it is; otherwise each
    backslash doubled and each byte that is not UTF-8 escaped (``\\xe9``), so that no escaped name can equal a real
    one (a file literally named ``\\xe9.jpg`` becomes ``\\\\xe9.jpg``)."""
    raw = name.encode("utf-8", "surrogateescape")
    if b"\\" not in raw:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")


def bad_samples_report_path(dst: str | os.PathLike) -> Path:
    """Where ``pack`` lists the files it skipped: ``<dst>.bad-samples.json``."""
    return Path(f"{dst}.bad-samples.json")


def _pack_files(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    samples: list[tuple[str, int]],
    meta: dict[str, Any],
    resume: bool,
    workers: int | None,
    commit_every: int,
    progress: bool,
    on_bad: str = "skip",
    check: str = "structure",
    resize: tuple[int, int] | None = None,
    stats: dict[str, os.stat_result] | None = None,
    unread: list[dict[str, str]] | None = None,
) -> Path:
    """Pack the files of ``samples`` (path, label) into ``dst``: read by threads in windows of at most
    ``commit_every`` records and :data:`WINDOW_BYTES` bytes into two reused buffers, one commit per window, so memory
    stays bounded and a resume restarts at a window's edge."""
    import json
    from concurrent.futures import Future, ThreadPoolExecutor

    from tqdm.auto import tqdm

    from lightning_gpu_boost.core.bad_samples import BadSampleError

    fingerprint, sizes = _scan_sources(src, [p for p, _ in samples], stats)
    if resize is not None:  # a resume must resize the same way
        fingerprint = f"{fingerprint}:max_side={resize[0]}:quality={resize[1]}"
    items = [(path, label, size) for (path, label), size in zip(samples, sizes, strict=True)]
    threads = pack_workers([s for s in sizes if s >= 0]) if workers is None else workers
    writer = PackWriter(dst, fingerprint, resume, commit_every, reserve=_pack_bytes([max(0, s) for s in sizes]))
    start = int(writer.state.get("source_next", writer.next_index))
    bad: list[dict[str, Any]] = list(writer.state.get("bad", []))
    if not writer.state and unread:  # files that are no regular files were never read: listed first
        if on_bad == "fail":
            writer.close()
            raise BadSampleError(f"Bad file {unread[0]['path']!r} in {str(src)!r}: {unread[0]['reason']}. Remove it "
                                 "and pack again, or pack with --on-bad skip to leave such files out and list them.")  # fmt: skip
        bad += unread
    level = None if check == "none" else check
    # the structure check (without resizing) runs here, between stores, rather than in the reading threads: there
    # its Python took the GIL from this thread, whose storing and committing is the pack's critical path (the
    # readers are a window ahead), and cost 16-21 % of pack time on the 16-CPU H200 machine for ~2.5 us of work per
    # file; here 3-5 % (benchmarks/lmdb_read.py). The decode check (Pillow, which lets go of the GIL) stays there.
    from lightning_gpu_boost.core.bad_samples import check_image

    check_here = level == "structure" and resize is None
    read_level = None if check_here else level
    try:
        with (
            ThreadPoolExecutor(max(1, threads)) as pool,
            tqdm(
                total=len(samples), initial=start, desc=f"pack {dst}", unit="img", disable=not progress
            ) as bar,
        ):
            arenas = _Arenas()
            windows = _windows(sizes, start, commit_every)

            def submit(lo: int, hi: int) -> list[Future]:
                window = items[lo:hi]
                outs = arenas.slices([size for _, _, size in window])
                if threads == 0:  # read here, between commits: no thread competes with LMDB for the GIL
                    done: Future = Future()
                    done.set_result(_read_records(window, read_level, resize, outs))
                    return [done]
                # one task per chunk of files: a future per small file costs more than reading it
                chunk = max(1, min(64, len(window) // (4 * threads)))
                return [
                    pool.submit(_read_records, window[i : i + chunk], read_level, resize, outs[i : i + chunk])
                    for i in range(0, len(window), chunk)
                ]

            ahead = submit(*windows[0]) if windows else []
            for k, (lo, hi) in enumerate(windows):
                current, ahead = ahead, (submit(*windows[k + 1]) if k + 1 < len(windows) else [])
                done = 0
                for future in current:  # the next window is read while this one is stored and committed
                    values = future.result()
                    if check_here:
                        for j, value in enumerate(values):
                            if not isinstance(value, tuple):
                                problem = check_image(memoryview(value)[HEADER.size :], level)
                                if problem is not None:
                                    values[j] = (items[lo + done + j][0], problem)
                    good = [v for v in values if not isinstance(v, tuple)]
                    for j, value in enumerate(values):
                        if not isinstance(value, tuple):
                            continue
                        path, reason = value
                        if on_bad == "fail":
                            raise BadSampleError(
                                f"Bad file {path!r}: {reason}. Fix or remove it and pack again (delete "
                                f"{str(dst)!r}.partial first: the source changed), or pack with --on-bad skip to "
                                "leave such files out and list them."
                            )
                        # the source index keeps each record's name its own (two names can read alike as text)
                        bad.append({"path": _relative(path, src), "reason": reason, "index": lo + done + j})
                    writer.add_values(good, auto_commit=False)  # one commit per window, with its state
                    done += len(values)
                writer.state = {"source_next": hi, "bad": bad}
                writer.commit(force=True)
                bar.update(done)
    except BaseException:
        writer.close()
        raise
    skipped = {entry["index"] for entry in bad if "index" in entry}
    named = {entry["path"] for entry in bad if "index" not in entry and entry not in (unread or [])}  # older state
    prefix = os.path.join(str(src), "")
    paths = [rel for i, rel in enumerate(_relative(p, src, prefix) for p, _ in samples)
             if i not in skipped and rel not in named]  # fmt: skip
    report = bad_samples_report_path(dst)
    if bad:
        report.write_text(json.dumps({"pack": str(dst), "source": str(src), "bad_samples": bad}, indent=1))
    elif report.exists():
        report.unlink()
    return writer.finish({**meta, "bad_samples": bad, "paths": paths})


def _pack_shards(
    src, dst, resume, workers, commit_every, progress, shard_size: int, on_bad, check, resize, shuffle_seed=None
) -> Path:  # fmt: skip
    import json

    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size!r}.")
    dst = Path(dst)
    if dst.exists():
        raise FileExistsError(f"{str(dst)!r} already exists; remove it or choose another destination.")
    stats: dict[str, os.stat_result] = {}
    unread: list[dict[str, str]] = []
    samples, classes, ignored = _scan(src, shuffle_seed, stats, unread)
    if unread and on_bad == "fail":
        from lightning_gpu_boost.core.bad_samples import BadSampleError

        raise BadSampleError(f"Bad file {unread[0]['path']!r} in {str(src)!r}: {unread[0]['reason']}. Remove it and "
                             "pack again, or pack with --on-bad skip to leave such files out and list them.")  # fmt: skip
    shards, bad, offset = [], list(unread), 0
    for k, lo in enumerate(range(0, len(samples), shard_size)):
        part, chunk = shard_path(dst, k), samples[lo : lo + shard_size]
        if not part.exists():  # finished shards are kept on resume
            _pack_files(
                src, part, chunk, _image_meta(classes, ignored, resize, shuffle_seed), resume, workers, commit_every, progress,
                on_bad, check, resize, stats,
            )  # fmt: skip
        reader = PackReader(part)
        bad += reader.meta("bad_samples") or []
        shards.append({"path": part.name, "offset": offset, "length": reader.length})
        offset += reader.length
        bad_samples_report_path(part).unlink(missing_ok=True)  # one report for the whole pack, below
    manifest = {
        "format": MANIFEST_FORMAT, "version": SCHEMA_VERSION, "length": offset, "shards": shards,
        "meta": {**_image_meta(classes, ignored, resize, shuffle_seed), "bad_samples": bad},
    }  # fmt: skip
    if bad:
        bad_samples_report_path(dst).write_text(
            json.dumps({"pack": str(dst), "source": str(src), "bad_samples": bad}, indent=1)
        )
    tmp = Path(f"{dst}.tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, dst)  # the manifest is written last
    return dst


def pack_dataset(
    dataset: Any,
    dst: str | os.PathLike,
    resume: bool = False,
    commit_every: int = 1000,
    progress: bool = True,
) -> Path:
    """Pack any indexable dataset of samples (dicts/tuples of arrays, tensors, numbers, strings) with msgpack.

    The fingerprint is the dataset's class and length; resuming requires the same dataset in the same order.
    """
    from tqdm.auto import tqdm

    n = len(dataset)
    writer = PackWriter(
        dst, f"{type(dataset).__module__}.{type(dataset).__qualname__}:{n}", resume, commit_every
    )
    try:
        for i in tqdm(range(writer.next_index, n), total=n, initial=writer.next_index, disable=not progress):
            writer.add(pack_sample(dataset[i]), -1, "msgpack")
    except BaseException:
        writer.close()
        raise
    return writer.finish({"kind": "samples"})
