"""Diagnosis: where a cold block-shuffled pass read one record at a time (bigger_than_ram.py's
``block_one_at_a_time`` cell) waits, window by window, by how far ahead blocks are asked for and where the CRCs
are checked:

- ``ahead``: windows asked for ahead of the one being read (``read_ahead_windows`` asks 1);
- ``crc``: ``ahead_thread`` (the read-ahead thread checks each populated block's records, ``read`` skips them:
  the reader's default since this script), ``reader`` (every record checked by ``read`` in the reading thread, as
  before), ``off`` (``check_crc=False``: the bound);
- per pass: MB/s, the reading thread's major page faults (``RUSAGE_THREAD``), each window's time (the median and
  the first ten: the first windows of a cold pass are the slow ones), and a warm pass with and without the check.

    cd benchmarks/diagnostics && python block_pass_windows.py --pack /tmp/demo/jpeg-8000-x8-shuffled.lmdb
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

from _common import drop_cache

from lightning_gpu_boost.core import lmdb_reader
from lightning_gpu_boost.core.block_shuffle import block_order, block_size_for
from lightning_gpu_boost.core.results import write_result

VARIANTS = {"ahead1_thread_crc": (1, "ahead_thread"), "ahead1_reader_crc": (1, "reader"), "ahead1_no_crc": (1, "off"),
            "ahead2_thread_crc": (2, "ahead_thread"), "ahead2_reader_crc": (2, "reader")}  # fmt: skip


def one_pass(pack: str, ahead: int, crc: str, window_blocks: int = 16) -> dict:
    lmdb_reader.close_readers(pack)
    drop_cache([pack])
    reader = lmdb_reader.open_pack(pack, check_crc=crc != "off")
    if crc == "reader":
        reader._verify_ahead = lambda lo, hi: None  # the thread maps blocks ahead but leaves the checks to read()
    n = len(reader)
    block = block_size_for(n, Path(pack).stat().st_size, 4 << 20)
    order, window = block_order(n, block, window_blocks, 0, 0), block * window_blocks

    def ask(lo: int) -> None:
        for b in sorted({i // block for i in order[lo : lo + window]}):
            reader.will_need(b * block, min(n, (b + 1) * block), populate=True)

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
    return {"MB_s": nbytes / took / 1e6, "major_faults": resource.getrusage(resource.RUSAGE_THREAD).ru_majflt - faults,
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
        for name, (ahead, crc) in VARIANTS.items():
            runs[name].append(r := one_pass(args.pack, ahead, crc))
            print(f"{name:20s} {r['MB_s']:7,.0f} MB/s  faults {r['major_faults']:4d}  window {r['window_ms_median']:5.1f} ms"
                  f"  first {r['window_ms_first10']}", flush=True)  # fmt: skip
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
