"""Diagnosis: where a block-shuffled pass over a pack goes when one process reads every record itself (no loader
workers: bigger_than_ram.py's ``block_one_at_a_time`` cell), by the way blocks are asked for ahead of use:

- ``none``: no read-ahead but the kernel's read-around of each fault;
- ``inline``: each block looked up and asked for (``madvise(WILLNEED)``) in the reading thread itself, a window
  ahead (before 6816b30);
- ``thread``: the same lookups and calls made by the reader's background thread (``lmdb_reader._Advisor``);
- ``thread_populate``: and each block mapped ahead into the process (``MADV_POPULATE_READ``), as LMDBDataModule
  asks without workers;
- ``thread_populate_random``: the same over a map without the kernel's read-around of faults
  (``PackReader(readahead=False)``: ``MADV_RANDOM``): a fault outside the blocks asked for (the B-tree's pages that
  every lookup walks, spread over the file) reads its page alone instead of ``read_ahead_kb`` around it.

Each case reads the pack cold (page cache dropped before: root) and then warm (a new memory map over the cached
file), ``--rounds`` times in turn; bytes/s of the whole pass, the seconds the reading thread spent inside the
read-ahead calls, and the per-record time warm (the CRC check touches every byte).

    python benchmarks/diagnostics/block_read_ahead.py --pack /tmp/demo/jpeg-8000-x8-shuffled.lmdb
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial
from pathlib import Path

from _common import RESULTS, drop_cache

from lightning_gpu_boost.core.block_shuffle import BlockShuffleSampler, block_size_for
from lightning_gpu_boost.core.lmdb import page_cache, sharded
from lightning_gpu_boost.core.lmdb import reader as lmdb_reader
from lightning_gpu_boost.core.results import write_result

CASES = ("none", "inline", "thread", "thread_populate", "thread_populate_random")


class _Inline:
    """Stands in for the background advisor: makes the calls in the asking thread (the behaviour before)."""

    def __init__(self) -> None:
        self.queue = self
        self.spent = 0.0

    def put(self, span: tuple[int, int, int, bool]) -> None:
        start = time.perf_counter()
        lmdb_reader._Advisor._advise(self, [(*span[:3], False)])  # type: ignore[arg-type]
        self.spent += time.perf_counter() - start

    populate_ok = False


def one_pass(pack: str, case: str, cold: bool) -> dict:
    lmdb_reader.close_readers(pack)
    if cold:
        drop_cache([pack])
    reader = sharded.open_pack(pack, readahead=case != "thread_populate_random")
    n = len(reader)
    block = block_size_for(n, Path(pack).stat().st_size, 4 << 20)
    sampler = BlockShuffleSampler(range(n), block, 16, seed=0, num_replicas=1, rank=0)
    inline = _Inline()
    original = lmdb_reader._advisor
    asking = [0.0]
    if case != "none":
        ask = partial(reader.will_need, populate=case.startswith("thread_populate"))

        def timed_ask(lo: int, hi: int) -> None:
            start = time.perf_counter()
            ask(lo, hi)
            asking[0] += time.perf_counter() - start

        sampler.will_need = timed_ask
    if case == "inline":
        lmdb_reader._advisor = lambda: inline
    try:
        start = time.perf_counter()
        nbytes = sum(reader.read(i, lambda r: len(r.payload)) for i in sampler)
        took = time.perf_counter() - start
    finally:
        lmdb_reader._advisor = original
    return {"bytes_s": nbytes / took, "us_per_record": took / n * 1e6, "asking_s": asking[0], "seconds": took}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pack", default="/tmp/demo/jpeg-8000-x8-shuffled.lmdb")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--out", default=RESULTS, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    page_cache.WHOLE_PACK_PREFETCH_FRACTION = 0
    runs: dict = {case: {"cold": [], "warm": []} for case in args.cases}
    for _ in range(args.rounds):
        for case in args.cases:
            for temp in ("cold", "warm"):
                r = one_pass(args.pack, case, temp == "cold")
                runs[case][temp].append(r)
                print(f"{case:16s} {temp}: {r['bytes_s'] / 1e6:7,.0f} MB/s  {r['us_per_record']:6.1f} us/record  "
                      f"asking {r['asking_s']:.3f} s of {r['seconds']:.2f} s", flush=True)  # fmt: skip
    summary = {case: {temp: statistics.median(r["bytes_s"] for r in rs) for temp, rs in v.items()}
               for case, v in runs.items()}  # fmt: skip
    print(json.dumps(summary, indent=1))
    figures = {"config": vars(args), "records": len(sharded.open_pack(args.pack)), "median_bytes_s": summary,
               "runs": runs}  # fmt: skip
    print(f"wrote {write_result('block_read_ahead', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
