"""Diagnosis: where a cold block-shuffled pass read one record at a time (bigger_than_ram.py's
``block_one_at_a_time`` cell) waits, window by window, by whether the CRCs are checked and how, and what the reader
knows of the pack's B-tree:

- blocks asked for a window ahead (``read_ahead_windows``; ``--ahead``: more windows), each block mapped ahead
  (``populate``, as without loader workers) by the reader's one read-ahead thread (``--threads N``: each block by
  one of a pool of N threads);
- ``crc``: ``isal`` (every record checked by ``read`` with ISA-L's CRC-32: ``lmdb_format.crc32``, the default where
  python-isal is installed, since 2026-11-25), ``zlib`` (the same with ``zlib.crc32``: before) or ``off``
  (``check_crc=False``: the bound);
- ``tree``: ``extents`` (the reader asks for the B-tree's branch and leaf pages once, with its first block, and
  reads from the leaf pages where every record lies, so a block's span is found without touching it:
  ``PackReader._read_tree_ahead``, the default since 2026-11-25), ``pages`` (the pages asked for, each block's span
  found by looking up its first and last records, which faults on them: bbf9a81) or ``none`` (neither: before);
- per pass: MB/s, the reading thread's major page faults (``RUSAGE_THREAD``), each window's time (the median, the
  first ten and those over 100 ms), and warm passes with each check.

Walking every key first with the kernel's read-around off (3df9982, replaced by the tree read-ahead) faulted on
each value's first page too: 64,400 faults, 2.5-2.9 s for the pack, 637-757 MB/s in all
(``benchmarks/results/history/block_pass_windows-2026-11-25-h100-3df9982.md``). A first version checked the CRCs of each populated block in the read-ahead thread, ``read`` skipping those records
(ecf570c, reverted): cold passes of 1,004 and 934 MB/s against 1,136 and 880 with the checks in the reading thread,
and more faults in the reading thread (398 and 351 against 219 and 234): the one read-ahead thread fell behind
(``benchmarks/results/history/block_pass_windows-2026-11-25-h100-eebc196.md``).

    cd benchmarks/diagnostics && python block_pass_windows.py --pack /tmp/demo/jpeg-8000-x8-shuffled.lmdb
    python block_pass_windows.py --rounds 4 --variants zlib_pages isal_extents   # main before and after
    python block_pass_windows.py --variants isal_extents --ahead 1 2 4 --threads 1 4   # read-ahead depth, a pool
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import RESULTS, drop_cache
from isal import isal_zlib

from lightning_gpu_boost.core.block_shuffle import block_order, block_size_for
from lightning_gpu_boost.core.lmdb import format as lmdb_format
from lightning_gpu_boost.core.lmdb import page_cache, sharded
from lightning_gpu_boost.core.lmdb import reader as lmdb_reader
from lightning_gpu_boost.core.results import write_result

VARIANTS = {f"{crc}_{tree}": (crc, tree) for crc in ("isal", "zlib", "off") for tree in ("extents", "pages", "none")}


def use_crc(crc: str) -> None:
    """The CRC-32 ``read`` checks records with: ISA-L's or zlib's."""
    lmdb_format._CRC32[:] = [zlib.crc32 if crc == "zlib" else isal_zlib.crc32]


def one_pass(pack: str, crc: str, tree: str, window_blocks: int = 16, ahead: int = 1, threads: int = 1) -> dict:
    lmdb_reader.close_readers(pack)
    drop_cache([pack])
    use_crc(crc)
    reader = sharded.open_pack(pack, check_crc=crc != "off")
    if tree == "none":
        reader._read_tree_ahead = lambda: 0
    elif tree == "pages":  # the tree's pages asked for, the blocks' spans found by lookups (bbf9a81)
        read_tree = reader._read_tree_ahead

        def pages_only() -> int:
            asked = read_tree()
            reader._extents = None
            return asked

        reader._read_tree_ahead = pages_only
    n = len(reader)
    block = block_size_for(n, Path(pack).stat().st_size, 4 << 20)
    order, window = block_order(n, block, window_blocks, 0, 0), block * window_blocks

    pool = ThreadPoolExecutor(threads) if threads > 1 else None

    def fetch(lo: int, hi: int) -> None:  # one block by one of the pool's threads: asked for, then mapped
        with lmdb_reader._CLOSE_LOCK:
            reader._read_tree_ahead()
            span = reader._span(lo, hi)
        if span is not None:
            start, end, chunk = span
            for a in range(start, end, chunk):
                lmdb_reader._MADVISE(a, min(chunk, end - a), lmdb_reader._MADV_WILLNEED)
            lmdb_reader._MADVISE(start, end - start, lmdb_reader._MADV_POPULATE_READ)

    def ask(lo: int) -> None:
        for b in sorted({i // block for i in order[lo : lo + window]}):
            if pool is None:
                reader.will_need(b * block, min(n, (b + 1) * block), populate=True)
            else:
                pool.submit(fetch, b * block, min(n, (b + 1) * block))

    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt
    start, nbytes, windows = time.perf_counter(), 0, []
    for k in range(ahead):
        ask(k * window)
    for lo in range(0, n, window):
        if lo + ahead * window < n:
            ask(lo + ahead * window)
        t = time.perf_counter()
        nbytes += sum(reader.read(i, lambda r: len(r.payload)) for i in order[lo : lo + window])
        windows.append(time.perf_counter() - t)
    took = time.perf_counter() - start
    if pool is not None:
        pool.shutdown()
    return {"ahead": ahead, "threads": threads, "MB_s": nbytes / took / 1e6,
            "major_faults": resource.getrusage(resource.RUSAGE_THREAD).ru_majflt - faults,
            "window_ms_median": 1000 * statistics.median(windows),
            "window_ms_first10": [round(1000 * w) for w in windows[:10]], "windows": len(windows),
            "window_ms_over_100": [round(1000 * w) for w in windows if w > 0.1]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", default="/tmp/demo/jpeg-8000-x8-shuffled.lmdb")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=["zlib_pages", "zlib_extents", "isal_extents", "off_extents"],
                        choices=list(VARIANTS))  # fmt: skip
    parser.add_argument("--ahead", type=int, nargs="+", default=[1], help="windows asked for ahead (each a cell)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1],
                        help="1: the reader's one read-ahead thread; N: each block asked for and mapped by one of N "
                             "threads (each a cell)")  # fmt: skip
    parser.add_argument("--out", default=RESULTS, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    page_cache.WHOLE_PACK_PREFETCH_FRACTION = 0
    cells = [(v, a, t) for v in args.variants for a in args.ahead for t in args.threads]
    label = {
        c: c[0] + (f"_ahead{c[1]}" if c[1] != 1 else "") + (f"_threads{c[2]}" if c[2] != 1 else "")
        for c in cells
    }
    runs: dict = {label[c]: [] for c in cells}
    for _ in range(args.rounds):
        for cell in cells:
            name = label[cell]
            runs[name].append(r := one_pass(args.pack, *VARIANTS[cell[0]], ahead=cell[1], threads=cell[2]))
            print(f"{name:30s} {r['MB_s']:7,.0f} MB/s  faults {r['major_faults']:4d}  window {r['window_ms_median']:5.1f} ms"
                  f"  first {r['window_ms_first10']}", flush=True)  # fmt: skip
    warm = {}
    for crc in ("isal", "zlib", "off"):  # the pack is in the page cache after the last pass
        lmdb_reader.close_readers(args.pack)
        use_crc(crc)
        reader = sharded.open_pack(args.pack, check_crc=crc != "off")
        start = time.perf_counter()
        nbytes = sum(reader.read(i, lambda r: len(r.payload)) for i in range(0, len(reader), 3))
        warm[crc] = nbytes / (time.perf_counter() - start) / 1e6
    print(f"warm, one at a time: {warm}")
    median = {name: statistics.median(r["MB_s"] for r in rs) for name, rs in runs.items()}
    figures = {"config": vars(args), "median_MB_s": median, "warm_MB_s": warm, "runs": runs}
    print(f"wrote {write_result('block_pass_windows', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
