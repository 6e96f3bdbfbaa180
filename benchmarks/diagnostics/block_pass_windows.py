"""Diagnosis: where a cold block-shuffled pass read one record at a time (bigger_than_ram.py's
``block_one_at_a_time`` cell) waits, window by window, by how far ahead blocks are asked for, whether the CRCs are
checked, and whether the pack's B-tree was read beforehand:

- ``ahead``: windows asked for ahead of the one being read (``read_ahead_windows`` asks 1), each block mapped ahead
  (``populate``, as without loader workers);
- ``crc``: ``reader`` (every record checked by ``read``) or ``off`` (``check_crc=False``: the bound);
- ``tree``: the records' keys walked first (a cursor over the keys alone: it reads the B-tree's leaf and branch
  pages, not the values), with the kernel's read-around off for the walk (``MADV_RANDOM``, then back to
  ``MADV_NORMAL``), timed;
- per pass: MB/s, the reading thread's major page faults (``RUSAGE_THREAD``), each window's time (the median and
  the first ten: the first windows of a cold pass are the slow ones), and a warm pass with and without the check.

A first version checked the CRCs of each populated block in the read-ahead thread, ``read`` skipping those records
(ecf570c, reverted): cold passes of 1,004 and 934 MB/s against 1,136 and 880 with the checks in the reading thread,
and more faults in the reading thread (398 and 351 against 219 and 234): the one read-ahead thread fell behind
(``benchmarks/results/history/block_pass_windows-2026-11-25-h100-eebc196.md``).

    cd benchmarks/diagnostics && python block_pass_windows.py --pack /tmp/demo/jpeg-8000-x8-shuffled.lmdb
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

from _common import drop_cache

from lightning_gpu_boost.core import lmdb_reader
from lightning_gpu_boost.core.block_shuffle import block_order, block_size_for
from lightning_gpu_boost.core.results import write_result

VARIANTS = {"ahead1_crc": (1, "reader", False), "ahead1_crc_tree": (1, "reader", True), "ahead1_no_crc": (1, "off", False),
            "ahead1_no_crc_tree": (1, "off", True)}  # fmt: skip


def pack_mappings(path: str) -> list[tuple[int, int]]:
    """This process's memory maps of ``path`` (``/proc/self/maps``): ``(start, end)`` addresses."""
    real, found = os.path.realpath(path), []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                found.append((lo, hi))
    return found


def walk_tree(reader) -> tuple[float, int, int]:
    """Read the pack's B-tree (every key, no value) with the map's read-around off: seconds, keys, the major
    faults the walk took."""
    from lightning_gpu_boost.core.lmdb_format import RECORDS

    env = reader._open()
    maps = pack_mappings(reader.path)
    madvise = lmdb_reader._MADVISE
    start = time.perf_counter()
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt
    for lo, hi in maps:  # MADV_RANDOM: a fault reads its page alone
        if madvise(lo, hi - lo, 1) != 0:
            raise OSError(f"madvise(MADV_RANDOM) failed on {lo:#x}-{hi:#x}")
    try:
        with env.begin(db=reader._dbs[RECORDS], buffers=True) as txn:
            keys = sum(1 for _ in txn.cursor().iternext(keys=True, values=False))
    finally:
        for lo, hi in maps:
            madvise(lo, hi - lo, 0)  # MADV_NORMAL
    return time.perf_counter() - start, keys, resource.getrusage(resource.RUSAGE_THREAD).ru_majflt - faults


def one_pass(pack: str, ahead: int, crc: str, tree: bool, window_blocks: int = 16) -> dict:
    lmdb_reader.close_readers(pack)
    drop_cache([pack])
    reader = lmdb_reader.open_pack(pack, check_crc=crc != "off")
    n = len(reader)
    block = block_size_for(n, Path(pack).stat().st_size, 4 << 20)
    order, window = block_order(n, block, window_blocks, 0, 0), block * window_blocks

    def ask(lo: int) -> None:
        for b in sorted({i // block for i in order[lo : lo + window]}):
            reader.will_need(b * block, min(n, (b + 1) * block), populate=True)

    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_majflt
    start, nbytes, windows = time.perf_counter(), 0, []
    walked = walk_tree(reader) if tree else None  # inside the pass's time
    tree_s = walked[0] if walked else None
    for k in range(ahead):
        ask(k * window)
    for lo in range(0, n, window):
        if lo + ahead * window < n:
            ask(lo + ahead * window)
        t = time.perf_counter()
        nbytes += sum(reader.read(i, lambda r: len(r.payload)) for i in order[lo : lo + window])
        windows.append(time.perf_counter() - t)
    took = time.perf_counter() - start
    return {"MB_s": nbytes / took / 1e6, "tree_walk_s": tree_s, "tree_walk_faults": walked[2] if walked else None,
            "major_faults": resource.getrusage(resource.RUSAGE_THREAD).ru_majflt - faults,
            "window_ms_median": 1000 * statistics.median(windows),
            "window_ms_first10": [round(1000 * w) for w in windows[:10]], "windows": len(windows)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", default="/tmp/demo/jpeg-8000-x8-shuffled.lmdb")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    lmdb_reader.WHOLE_PACK_PREFETCH_FRACTION = 0
    runs: dict = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, (ahead, crc, tree) in VARIANTS.items():
            runs[name].append(r := one_pass(args.pack, ahead, crc, tree))
            print(f"{name:20s} {r['MB_s']:7,.0f} MB/s  faults {r['major_faults']:4d}  window {r['window_ms_median']:5.1f} ms"
                  f"  first {r['window_ms_first10']}  tree {r['tree_walk_s']}", flush=True)  # fmt: skip
    warm = {}
    for check in (True, False):  # the pack is in the page cache after the last pass
        lmdb_reader.close_readers(args.pack)
        reader = lmdb_reader.open_pack(args.pack, check_crc=check)
        start = time.perf_counter()
        nbytes = sum(reader.read(i, lambda r: len(r.payload)) for i in range(0, len(reader), 3))
        warm["crc" if check else "no_crc"] = nbytes / (time.perf_counter() - start) / 1e6
    print(f"warm, one at a time: {warm}")
    median = {name: statistics.median(r["MB_s"] for r in rs) for name, rs in runs.items()}
    figures = {"config": vars(args), "median_MB_s": median, "warm_MB_s": warm, "runs": runs}
    print(f"wrote {write_result('block_pass_windows', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
