"""Reading a whole pack into the page cache in the background when it fits in memory, in chunks the kernel honours."""

from __future__ import annotations

import os
import threading

__all__ = ['WHOLE_PACK_PREFETCH_FRACTION', 'readahead_chunk']

#: packs up to this fraction of the available memory are read into the page cache whole, in the background, when
#: first opened (:func:`_prefetch_if_small`); larger ones are read where they are used (readahead around each read,
#: and :meth:`PackReader.will_need` for a block-shuffled order). ``benchmarks/bigger_than_ram.py`` sets it to 0 to
#: read a pack that fits in memory as one that does not would be read.
WHOLE_PACK_PREFETCH_FRACTION = 0.25


_PREFETCHED: set[str] = set()  # packs this process (or the parent it was forked from) has asked for whole


def readahead_chunk(path: str) -> int:
    """The most bytes one ``WILLNEED`` request reads on ``path``'s disk: Linux caps each ``posix_fadvise`` or
    ``madvise(MADV_WILLNEED)`` call at the larger of the device's ``read_ahead_kb`` and ``max_sectors_kb`` (the rest
    of a longer range is silently not read), so a long range is asked for in chunks of this size. 128 KiB (the
    kernel's default readahead) where the device does not say (network and virtual filesystems)."""
    try:
        dev = os.stat(path).st_dev
        base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    except (OSError, AttributeError, ValueError):
        return 128 << 10
    for queue in (f"{base}/queue", f"{base}/../queue"):  # a disk, or the disk of a partition
        try:
            with open(f"{queue}/read_ahead_kb") as a, open(f"{queue}/max_sectors_kb") as b:
                return max(128, int(a.read()), int(b.read())) << 10
        except (OSError, ValueError):
            continue
    return 128 << 10


def _read_whole(path: str, size: int) -> None:
    """Ask for every chunk of the file (``POSIX_FADV_WILLNEED``), front to back; run in a daemon thread."""
    chunk = readahead_chunk(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        for offset in range(0, size, chunk):
            os.posix_fadvise(fd, offset, min(chunk, size - offset), os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def _prefetch_if_small(path: str) -> None:
    """Have the kernel read the whole file into the page cache in the background (``POSIX_FADV_WILLNEED`` over
    every :func:`readahead_chunk`, from a daemon thread, once per file and process tree: forked DataLoader workers
    inherit the parent's request) when it takes at most :data:`WHOLE_PACK_PREFETCH_FRACTION` of the available
    memory: training reads every record each epoch, and one sequential pass is cheaper than the random reads of the
    first epoch on a cold cache. Larger packs are left to readahead around each read."""
    if not hasattr(os, "posix_fadvise") or WHOLE_PACK_PREFETCH_FRACTION <= 0:
        return
    real = os.path.realpath(path)
    if real in _PREFETCHED:
        return
    try:
        size = os.path.getsize(path)
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return
    if size <= available * WHOLE_PACK_PREFETCH_FRACTION:
        _PREFETCHED.add(real)
        threading.Thread(target=_read_whole, args=(path, size), name="lgb-pack-prefetch", daemon=True).start()
