"""Diagnosis: packing speed by reading threads, against `cp -r`, for ~100 KB and ~4 KB files (page cache warm).

    python benchmarks/lmdb_pack_workers.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from _common import parser_for
from lmdb_read import make_tree

from lightning_gpu_boost.core.lmdb_format import pack_image_folder
from lightning_gpu_boost.core.results import write_result


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    args = parser.parse_args()
    figures: dict = {"config": vars(args)}
    with tempfile.TemporaryDirectory(dir=os.environ.get("LGB_BENCH_TMP")) as tmp:
        for name, n, size in (("100KB", 2000, 100_000), ("4KB", 20000, 4_000)):
            src = make_tree(Path(tmp) / f"src-{name}", n, size)
            os.sync()
            start = time.perf_counter()
            subprocess.run(["cp", "-r", str(src), str(Path(tmp) / "copy")], check=True)
            cells = {"cp_r_s": time.perf_counter() - start}
            shutil.rmtree(Path(tmp) / "copy")
            for workers in args.workers:
                os.sync()
                start = time.perf_counter()
                pack = pack_image_folder(src, Path(tmp) / f"{name}-{workers}.lmdb", workers=workers, progress=False)
                cells[f"pack_s_{workers}_workers"] = time.perf_counter() - start
                os.remove(pack)
            figures[name] = cells
            print(name, {k: round(v, 3) for k, v in cells.items()})
    print(f"wrote {write_result('lmdb_pack_workers', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
