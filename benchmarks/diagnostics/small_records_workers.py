"""Diagnosis: bigger_than_ram.py's ``block_workers`` cell on its ~4 KB-record pack (``block_epoch_read_of_dd_4KB``,
>= 70 % of ``dd``), round by round, by what the sampler's read-ahead knows of the pack's B-tree, beside ``dd`` and
the same pass warm (the pack in the page cache: what the loader itself reaches, with no disk to wait for).

The cell read 0.85 and 0.88 of ``dd`` in two H100 runs before the reader took block spans from the records' places
(``lmdb_reader.record_extents``), and 0.66, 0.75 and 0.38 in three runs after. Cells, each after a cache drop:

- ``extents``: the reader as it is (the records' places read from the leaf pages with the first block asked for);
- ``pages``: the tree's pages asked for, spans found by lookups (``record_extents`` left out: the reader before);
- ``none``: neither (``_read_tree_ahead`` left out);
- ``warm``: the ``extents`` pass again without a drop.

    cd benchmarks/diagnostics && python small_records_workers.py --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from _common import RESULTS, dd_read, drop_cache
from bigger_than_ram import RawPack, block_sampler, small_records, timed_read

from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.lmdb import page_cache
from lightning_gpu_boost.core.lmdb import reader as lmdb_reader
from lightning_gpu_boost.core.results import write_result

TREES = ("extents", "pages", "none")


def one_pass(pack: str, tree: str, workers: int, cold: bool = True) -> dict:
    lmdb_reader.close_readers(pack)
    if cold:
        drop_cache([pack])
    extents, read_tree = lmdb_reader.record_extents, lmdb_reader.PackReader._read_tree_ahead
    if tree == "pages":
        lmdb_reader.record_extents = lambda *args: None
    elif tree == "none":
        lmdb_reader.PackReader._read_tree_ahead = lambda self: 0
    try:
        return timed_read(RawPack(pack), block_sampler(pack, workers), workers)
    finally:
        lmdb_reader.record_extents, lmdb_reader.PackReader._read_tree_ahead = extents, read_tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/tmp/demo")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=RESULTS, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    page_cache.WHOLE_PACK_PREFETCH_FRACTION = 0
    _, pack = small_records(Path(args.data), args.records)
    pack, workers = str(pack), max(1, usable_cpus() - 1)
    runs: dict = {"dd": [], **{t: [] for t in TREES}, "warm": []}
    for _ in range(args.rounds):
        drop_cache([pack])
        runs["dd"].append(dd_read(pack))
        for tree in TREES:
            runs[tree].append(one_pass(pack, tree, workers))
        runs["warm"].append(one_pass(pack, "extents", workers, cold=False))
        print("  ".join(f"{k} {(v[-1] if k == 'dd' else v[-1]['bytes_s']) / 1e6:,.0f}" for k, v in runs.items())
              + " MB/s", flush=True)  # fmt: skip
    median = {k: statistics.median(v if k == "dd" else [r["bytes_s"] for r in v]) for k, v in runs.items()}
    of_dd = {k: v / median["dd"] for k, v in median.items() if k != "dd"}
    figures = {"config": vars(args), "workers": workers, "median_bytes_s": median, "median_of_dd": of_dd,
               "runs": runs}  # fmt: skip
    print(f"of dd (medians): {of_dd}")
    print(f"wrote {write_result('small_records_workers', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
