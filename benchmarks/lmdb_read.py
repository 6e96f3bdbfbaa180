"""LMDB packs vs a folder of files: random-order reads (~100 KB and ~4 KB records, warm and cold page cache),
packing vs `cp -r && sync`, end-to-end LMDBDataModule vs ImageFolderDataModule images/s, and a `--max-side 256` pack
vs the same images at full size, in one run.

    python benchmarks/lmdb_read.py                      # CPU machine or GPU machine
    python benchmarks/lmdb_read.py --large 500 --small 5000 --images 640 --seconds 1

Warm cells: each side reads the same random order in steady state (a first pass left out, then passes for at least
0.25 s: one pass of 2,000 reads lasts a few milliseconds, and the first after the other side's runs with the CPU
caches holding the other side's data), in 9 adjacent pairs (order alternating), the median of the pairs' ratios. Cold cache: 3 pairs (order alternating), each read after its own drop, the median of the pairs' ratios; the drop is
`echo 3 > /proc/sys/vm/drop_caches` where permitted (root, not in most containers); otherwise each
file's pages are dropped with posix_fadvise(DONTNEED), which evicts clean unmapped pages: the JSON says which.

Packing vs `cp -r SRC DST && sync` (a durable copy): medians of 3 alternating runs, each after `os.sync()`; the
pack's time includes its own fsync before the atomic rename, the copy's the `sync` after it (`cp_r_s`: the copy
alone, its data left in the page cache, for reference). Cold cells also time one sequential read of the whole pack after a drop
(`pack_sequential_read_s`), the disk's speed that the whole-file read-ahead at open depends on. End to end: 5
adjacent pairs of windows of the two DataModules (order alternating), the median of the pairs' ratios.

Bars (issue 6, as issue 19 revised them): LMDB >= files in every cell, >= 2x files with ~4 KB records warm and
>= 1.3x cold (one random read per record is the floor on a cold cache); packing at least as fast as `cp -r && sync`;
LMDBDataModule >= ImageFolderDataModule images/s at the same workers.

Max side (issue 19): the demo tree packed as it is and with `max_side=256` (shorter sides above 256 resized and
re-encoded at pack time, as FFCV does); LMDBDataModule's training loader (decode, random-resized crop to 224, flip;
one worker per usable CPU) over each, 3 alternating windows each, medians. Bar: the max-side pack >= 1.5x.

Pack check (issue 21): the demo tree packed with `check="none"` and with the default `check="structure"`, 9
adjacent pairs (order alternating), the median of the pairs' ratios (`"decode"`, 3 runs, for reference), page cache
warm (the strictest case: reading costs least); bar: the default check costs <= 10 % of pack time. `--pack-check-only` runs just this part.

    python benchmarks/lmdb_read.py --pack-check-only --images 8000
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _common import demo_tree, drop_cache, parser_for

from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.lmdb import PackReader, close_readers, pack_image_folder
from lightning_gpu_boost.core.loader_rate import clone_loader, measure_loader
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.core.steady import SteadyRate, worst_halves_diff
from lightning_gpu_boost.datamodules import ImageFolderDataModule, LMDBDataModule

#: cold cells: pairs of reads, each side after its own cache drop (one pair moved by +-3 % on the H200 machine:
#: lmdb_read-2026-11-26-h200 read 4 KB at 1.32x, the next run at 1.29x)
COLD_PAIRS = 3


def make_tree(root: Path, n: int, size: int, classes: int = 10) -> Path:
    rng = random.Random(size)
    for i in range(n):
        folder = root / f"c{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:07d}.jpg").write_bytes(rng.randbytes(size))  # incompressible, named like images
    return root


def read_files(paths: list[str], order: list[int]) -> float:
    start = time.perf_counter()
    for i in order:
        with open(paths[i], "rb") as f:
            f.read()
    return len(order) / (time.perf_counter() - start)


def steady_reads(read_pass, reads: int, seconds: float = 0.25) -> float:
    """Items/s of ``read_pass`` (one pass of ``reads`` warm reads, returning its own rate) in steady state: a first
    pass is left out (after the other side's pass, the CPU caches hold its data, not this side's), then passes
    are repeated for at least ``seconds``."""
    read_pass()
    start, passes = time.perf_counter(), 0
    while time.perf_counter() - start < seconds or passes < 3:
        read_pass()
        passes += 1
    return passes * reads / (time.perf_counter() - start)


def read_sequentially(path: str) -> float:
    """Seconds to read the whole file in 8 MiB reads (the disk's sequential speed, for the cold cells)."""
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass
    return time.perf_counter() - start


def read_pack(path: str, order: list[int]) -> float:
    start = time.perf_counter()  # opening the pack is timed too, as each open() of a file is
    reader = PackReader(path)
    for i in order:
        reader.read(i, lambda r: bytes(r.payload))  # touch every byte, one copy (as f.read() makes)
    return len(order) / (time.perf_counter() - start)


def loader_window(dm, seconds: float) -> SteadyRate:
    """The train loader alone in steady state (core/steady.py, timed as the worker probe and image_folder.py time
    it): its batches repeat its epochs without end (an epoch's restart is not the loader's pace), the queue
    (workers x prefetch_factor batches) and 4 more are skipped, then at least ``seconds`` are timed, longer while
    the halves differ; images/s."""
    with dm.loaders_as_in_a_trainer():  # uint8 out, as training gets it
        loader = dm.train_dataloader()
    workers, size = loader.num_workers, loader.batch_size
    w = measure_loader(clone_loader(loader, workers, loader.prefetch_factor or 2), workers, cap_s=120,
                       min_window_s=seconds)  # fmt: skip
    return SteadyRate(w.rate * size, w.first_half * size, w.second_half * size, w.queue, w.warmup, w.timed, w.seconds)


def pack_check(root: Path, tmp: Path, pairs: int = 9, decode_runs: int = 3) -> dict:
    """Pack ``root`` with ``check="none"`` and ``"structure"`` in ``pairs`` adjacent pairs (the order alternating
    within pairs), the cost the median of the pairs' ratios: each pair shares the host's state of the moment (the
    disk's write-back, the neighbours' load), which moved single packs of this tree by +-13 % on the H100 machine,
    more than the check costs. ``"decode"`` is timed ``decode_runs`` times, for reference."""
    times: dict[str, list[float]] = {"none": [], "structure": [], "decode": []}

    def timed(level: str, k: int) -> float:
        os.sync()
        dst = tmp / f"check-{level}-{k}.lmdb"
        start = time.perf_counter()
        pack_image_folder(root, dst, check=level, progress=False)
        took = time.perf_counter() - start
        close_readers(dst)
        os.remove(dst)
        times[level].append(took)
        return took

    pack_image_folder(root, tmp / "warm.lmdb", check="none", progress=False)  # the page cache holds the tree
    close_readers(tmp / "warm.lmdb")
    os.remove(tmp / "warm.lmdb")
    ratios = []
    for k in range(pairs):
        order = ("none", "structure") if k % 2 == 0 else ("structure", "none")
        took = {level: timed(level, k) for level in order}
        ratios.append(took["structure"] / took["none"])
    for k in range(decode_runs):
        timed("decode", k)
    median = {level: statistics.median(t) for level, t in times.items()}
    files = sum(1 for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    return {"files": files, "runs_s": times, "median_s": median, "pair_ratios": ratios,
            "structure_cost_fraction": statistics.median(ratios) - 1,
            "decode_cost_fraction": median["decode"] / median["none"] - 1}  # fmt: skip


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--large", type=int, default=2000, help="~100 KB records")
    parser.add_argument("--small", type=int, default=20000, help="~4 KB records")
    parser.add_argument("--reads", type=int, default=2000, help="random reads per cell")
    parser.add_argument(
        "--workers", type=int, default=None, help="DataLoader workers (default: usable CPUs - 1)"
    )
    # 10 s: with 15 workers a 4 s window timed about 16 batches after the 34 it skips, and the H200's pairs of the
    # two DataModules spread 0.88-1.06x (lmdb_read-2026-11-26-h200.json)
    parser.add_argument("--seconds", type=float, default=10.0, help="shortest timed window per end-to-end run")
    parser.add_argument("--pairs", type=int, default=5, help="end-to-end pairs (ImageFolderDataModule, LMDBDataModule)")
    parser.add_argument("--pack-check-only", action="store_true", help="only time the pack-time check")
    args = parser.parse_args()
    figures: dict = {"config": vars(args), "reads": {}}
    bars = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("LGB_BENCH_TMP")) as tmp:
        figures["pack_check"] = pack_check(demo_tree(args), Path(tmp))
        cost = figures["pack_check"]["structure_cost_fraction"]
        bars["pack_check_cost_fraction"] = {"value": cost, "target": 0.10, "unit": "fraction of pack time",
                                            "pass": cost <= 0.10}  # fmt: skip
        print(f"pack check: {100 * cost:.1f} % of pack time (decode check: "
              f"{100 * figures['pack_check']['decode_cost_fraction']:.0f} %)")  # fmt: skip
        if args.pack_check_only:
            print(f"wrote {write_result('lmdb_read', figures, bars, args.out)}")
            return
        for name, n, size in (("100KB", args.large, 100_000), ("4KB", args.small, 4_000)):
            src = make_tree(Path(tmp) / f"src-{name}", n, size)
            files = sorted(str(p) for p in src.rglob("*.jpg"))
            # pack and `cp -r` alternate 3 times (medians), each after an `os.sync()` so that neither pays
            # for writing back the other's dirty pages
            pack_runs, cp_runs, sync_runs = [], [], []
            for k in range(3):
                os.sync()
                start = time.perf_counter()
                # random bytes named .jpg: raw I/O, no image check (check="none")
                pack = str(pack_image_folder(src, Path(tmp) / f"{name}-{k}.lmdb", check="none", progress=False))
                pack_runs.append(time.perf_counter() - start)
                os.sync()
                start = time.perf_counter()
                subprocess.run(["cp", "-r", str(src), str(Path(tmp) / f"copy-{name}-{k}")], check=True)
                cp_runs.append(time.perf_counter() - start)
                os.sync()  # what making the copy durable costs on top (the pack's time includes its fsync)
                sync_runs.append(time.perf_counter() - start - cp_runs[-1])
            for k in range(3):  # deleted only now: neither side pays for the other's deletions (discards)
                shutil.rmtree(Path(tmp) / f"copy-{name}-{k}")
                if k < 2:
                    close_readers(Path(tmp) / f"{name}-{k}.lmdb")
                    os.remove(Path(tmp) / f"{name}-{k}.lmdb")
            pack_s, cp_s = statistics.median(pack_runs), statistics.median(cp_runs)
            # records are in sorted-path order in both, so index i is the same sample
            order = random.Random(1).sample(range(n), min(args.reads, n))  # distinct records, random order
            cells = {}
            for cache in ("warm", "cold"):
                if cache == "warm":
                    read_files(files, list(range(n)))
                    read_pack(pack, list(range(n)))
                    how = "read once before"
                else:
                    how = None  # each cold read drops the caches first (below)
                if cache == "warm":  # 9 adjacent pairs (order alternating), the median of their ratios
                    runs = []
                    for k in range(9):
                        pair = {}
                        for side in ("files", "lmdb") if k % 2 == 0 else ("lmdb", "files"):
                            read = functools.partial(read_files, files, order) if side == "files" else functools.partial(read_pack, pack, order)
                            pair[side] = steady_reads(read, len(order))
                        runs.append(pair)
                    ratio = statistics.median(r["lmdb"] / r["files"] for r in runs)
                    cells[cache] = {"files_items_s": statistics.median(r["files"] for r in runs), "how": how,
                                    "lmdb_items_s": statistics.median(r["lmdb"] for r in runs), "runs": runs}  # fmt: skip
                else:  # 3 pairs (order alternating), each side read after its own drop, the median of the ratios
                    runs = []
                    for k in range(COLD_PAIRS):
                        pair = {}
                        for side in ("files", "lmdb") if k % 2 == 0 else ("lmdb", "files"):
                            close_readers(pack)
                            how = drop_cache([*files, pack])
                            pair[side] = read_files(files, order) if side == "files" else read_pack(pack, order)
                        runs.append(pair)
                    ratio = statistics.median(r["lmdb"] / r["files"] for r in runs)
                    cells[cache] = {"files_items_s": statistics.median(r["files"] for r in runs), "how": how,
                                    "lmdb_items_s": statistics.median(r["lmdb"] for r in runs), "runs": runs}  # fmt: skip
                cells[cache]["ratio"] = ratio
                if cache == "cold":  # what reading all of the pack costs, against the cell's random reads
                    close_readers(pack)
                    drop_cache([pack])
                    cells[cache]["pack_bytes"] = os.path.getsize(pack)
                    cells[cache]["pack_sequential_read_s"] = read_sequentially(pack)
                    cells[cache]["lmdb_reads_s"] = len(order) / cells[cache]["lmdb_items_s"]
                    cells[cache]["files_reads_s"] = len(order) / cells[cache]["files_items_s"]
                target = 1.0 if name == "100KB" else (2.0 if cache == "warm" else 1.3)
                bars[f"lmdb_vs_files_{name}_{cache}"] = bar(ratio, target, "x")
                print(f"{name} {cache}: files {cells[cache]['files_items_s']:,.0f}/s, LMDB "
                      f"{cells[cache]['lmdb_items_s']:,.0f}/s ({ratio:.2f}x, {how})")  # fmt: skip
            figures["reads"][name] = {**cells, "pack_s": pack_s, "cp_r_s": cp_s, "pack_runs_s": pack_runs,
                                      "cp_r_runs_s": cp_runs, "sync_after_cp_r_runs_s": sync_runs,
                                      "cp_r_then_sync_s": statistics.median(c + y for c, y in zip(cp_runs, sync_runs, strict=True))}  # fmt: skip
            durable_s = figures["reads"][name]["cp_r_then_sync_s"]
            bars[f"pack_vs_cp_r_sync_{name}"] = bar(durable_s / pack_s, 1.0, "x")
            print(f"{name}: pack {pack_s:.2f} s, cp -r && sync {durable_s:.2f} s (cp -r alone: {cp_s:.2f} s)")
            close_readers(pack)

        root = demo_tree(args)
        pack = str(pack_image_folder(root, Path(tmp) / "demo.lmdb", progress=False))
        workers = args.workers if args.workers is not None else max(0, (os.cpu_count() or 2) - 1)
        common = {"image_size": 224, "batch_size": args.batch_size, "num_workers": workers}
        # adjacent pairs, the order alternating, the median of the pairs' ratios: one short window moves by
        # several percent with the host's state, which a pair shares
        folder_windows, lmdb_windows = [], []
        for k in range(args.pairs):
            make = [lambda: folder_windows.append(loader_window(ImageFolderDataModule(str(root), **common), args.seconds)),
                    lambda: lmdb_windows.append(loader_window(LMDBDataModule(pack, **common), args.seconds))]  # fmt: skip
            for run in make if k % 2 == 0 else make[::-1]:
                run()
        folder_runs, lmdb_runs = [w.rate for w in folder_windows], [w.rate for w in lmdb_windows]
        folder_ips, lmdb_ips = statistics.median(folder_runs), statistics.median(lmdb_runs)
        pair_ratios = [b / a for a, b in zip(folder_runs, lmdb_runs, strict=True)]
        figures["end_to_end"] = {"workers": workers, "image_folder_img_s": folder_ips, "lmdb_img_s": lmdb_ips,
                                 "image_folder_runs": folder_runs, "lmdb_runs": lmdb_runs, "pair_ratios": pair_ratios,
                                 "windows": {"image_folder": [w.as_dict() for w in folder_windows],
                                             "lmdb": [w.as_dict() for w in lmdb_windows]}}  # fmt: skip
        bars["lmdb_datamodule_vs_image_folder"] = bar(statistics.median(pair_ratios), 1.0, "x")
        print(f"end to end ({workers} workers): ImageFolderDataModule {folder_ips:,.0f} img/s, LMDBDataModule "
              f"{lmdb_ips:,.0f} img/s (pairs: {statistics.median(pair_ratios):.3f}x)")  # fmt: skip

        small = str(pack_image_folder(root, Path(tmp) / "demo-256.lmdb", progress=False, max_side=256))
        side = {**common, "num_workers": usable_cpus()}
        full_windows, small_windows = [], []
        for _ in range(3):
            full_windows.append(loader_window(LMDBDataModule(pack, **side), args.seconds))
            small_windows.append(loader_window(LMDBDataModule(small, **side), args.seconds))
        full_ips = statistics.median(w.rate for w in full_windows)
        small_ips = statistics.median(w.rate for w in small_windows)
        figures["max_side"] = {"max_side": 256, "workers": side["num_workers"], "full_img_s": full_ips,
                               "max_side_img_s": small_ips, "full_pack_bytes": os.path.getsize(pack),
                               "max_side_pack_bytes": os.path.getsize(small),
                               "windows": {"full": [w.as_dict() for w in full_windows],
                                           "max_side": [w.as_dict() for w in small_windows]}}  # fmt: skip
        bars["max_side_256_vs_full"] = bar(small_ips / full_ips, 1.5, "x")
        print(f"max side 256 ({side['num_workers']} workers): full size {full_ips:,.0f} img/s, max side "
              f"{small_ips:,.0f} img/s ({small_ips / full_ips:.2f}x)")  # fmt: skip
        bars["steady_state_halves_max_diff"] = bar(
            worst_halves_diff({k: figures[k]["windows"] for k in ("end_to_end", "max_side")}), 0.05, "ratio",
            higher_is_better=False,
        )  # fmt: skip
    print(f"wrote {write_result('lmdb_read', figures, bars, args.out)}")


if __name__ == "__main__":
    main()
