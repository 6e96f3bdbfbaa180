"""Diagnosis: where a pack's time goes, by reading threads, against `cp -r`, for ~100 KB and ~4 KB files (page
cache warm): total, time in commits (LMDB's stores), time in finish() (the final fsync and rename), and the default
threads once more without the writeback started at each commit.

    python benchmarks/lmdb_pack_workers.py                       # medians of 3 runs per case
    python benchmarks/lmdb_pack_workers.py --workers 0 1 2 4 --repeats 5
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _common import parser_for
from lmdb_read import make_tree

from lightning_gpu_boost.core import lmdb as lf
from lightning_gpu_boost.core.results import write_result

SPENT = {"commit_s": 0.0, "finish_s": 0.0}


def timed(name: str, method):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            SPENT[name] += time.perf_counter() - start

    return wrapper


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    figures: dict = {"config": vars(args)}
    lf.PackWriter.commit = timed("commit_s", lf.PackWriter.commit)
    lf.PackWriter.finish = timed("finish_s", lf.PackWriter.finish)
    writeback = lf._writeback
    cases = [(str(w), w, True) for w in args.workers] + [("default", None, True), ("default_no_writeback", None, False)]
    with tempfile.TemporaryDirectory(dir=os.environ.get("LGB_BENCH_TMP")) as tmp:
        for name, n, size in (("100KB", 2000, 100_000), ("4KB", 20000, 4_000)):
            src = make_tree(Path(tmp) / f"src-{name}", n, size)
            runs: dict = {case: [] for case, _, _ in cases}
            runs["cp_r"] = []
            for k in range(args.repeats):  # cases alternate, each after os.sync()
                for case, workers, background in cases:
                    lf._writeback = writeback if background else (lambda: lambda fd: None)
                    SPENT.update(commit_s=0.0, finish_s=0.0)
                    os.sync()
                    start = time.perf_counter()
                    pack = lf.pack_image_folder(src, Path(tmp) / f"{name}.lmdb", workers=workers, progress=False)
                    runs[case].append({"total_s": time.perf_counter() - start, **SPENT})
                    lf.close_readers(pack)
                    os.remove(pack)
                lf._writeback = writeback
                os.sync()
                start = time.perf_counter()
                subprocess.run(["cp", "-r", str(src), str(Path(tmp) / f"copy-{k}")], check=True)
                runs["cp_r"].append(time.perf_counter() - start)
            for k in range(args.repeats):
                shutil.rmtree(Path(tmp) / f"copy-{k}")
            medians = {case: {key: statistics.median(r[key] for r in runs[case]) for key in runs[case][0]}
                       for case, _, _ in cases}  # fmt: skip
            figures[name] = {"runs": runs, "medians": medians, "cp_r_s": statistics.median(runs["cp_r"]),
                             "default_workers": lf.pack_workers([size] * n)}  # fmt: skip
            print(name, f"cp -r {figures[name]['cp_r_s']:.3f} s;",
                  "; ".join(f"{case} {m['total_s']:.3f} s (commits {m['commit_s']:.3f}, finish {m['finish_s']:.3f})"
                            for case, m in medians.items()))  # fmt: skip
    print(f"wrote {write_result('lmdb_pack_workers', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
