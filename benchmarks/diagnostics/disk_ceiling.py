"""Diagnosis: the most this machine's disk reads, by any access pattern, against random-order files read one at a
time: the ceiling of bigger_than_ram.py's ``block_read_vs_random_files`` bar (a block order read one record at a
time, >= 3x files in random order, ~77 KB each). No reader of a pack can read faster than the disk does.

In one run, each cell after a cache drop (root: ``drop_caches``):

- ``dd``: ``dd bs=8M`` over a large file (bigger_than_ram.py's sequential figure);
- ``pread_<mode>_<threads>``: the same file read by ``threads`` threads, each taking the next 8 MiB chunk
  (``os.preadv``, which lets go of the GIL), ``direct`` (``O_DIRECT``: no page cache, the device's own rate) or
  ``buffered`` (through the page cache, with the kernel's read-around);
- ``files_one_at_a_time`` / ``files_threads_16``: ``--files`` files of ~4-150 KB (the demo JPEGs' spread, mean
  ~77 KB), read whole in a random order, one at a time and by 16 threads;
- the block device's ``read_ahead_kb``, ``max_sectors_kb`` and ``nr_requests`` where /sys names them.

    cd benchmarks/diagnostics && python disk_ceiling.py --dir /tmp/disk_ceiling --gib 4
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
from _common import RESULTS, dd_read, drop_cache, parallel_read

from lightning_gpu_boost.core.results import write_result

CHUNK = 8 << 20


def make_data(root: Path, gib: float, files: int) -> tuple[Path, list[Path]]:
    """A ``gib`` GiB file of random bytes and ``files`` files of random sizes (made once; reused if present)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    big = root / "big.bin"
    want = int(gib * (1 << 30)) // CHUNK * CHUNK
    if not big.exists() or big.stat().st_size != want:
        with open(big, "wb") as f:
            for _ in range(want // CHUNK):
                f.write(rng.integers(0, 256, CHUNK, dtype=np.uint8).tobytes())
    tree = root / "files"
    tree.mkdir(exist_ok=True)
    paths = [tree / f"{i:06d}.bin" for i in range(files)]
    sizes = np.clip(rng.lognormal(np.log(70_000), 0.45, files), 4_000, 150_000).astype(int)
    for path, size in zip(paths, sizes, strict=True):
        if not path.exists():
            path.write_bytes(rng.integers(0, 256, int(size), dtype=np.uint8).tobytes())
    os.sync()
    return big, paths


def read_files(paths: list[Path], threads: int) -> float:
    order = random.Random(0).sample(paths, len(paths))
    total = [0]
    lock = threading.Lock()
    nxt = [0]

    def work() -> None:
        n = 0
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(order):
                break
            with open(order[i], "rb") as f:
                n += len(f.read())
        with lock:
            total[0] += n

    pool = [threading.Thread(target=work) for _ in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return total[0] / (time.perf_counter() - start)


def queue_settings(path: Path) -> dict:
    """The block device's queue settings under ``path`` (where /sys names them)."""
    out: dict = {}
    try:
        dev = os.stat(path).st_dev
        sysdev = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
        queue = sysdev / "queue" if (sysdev / "queue").exists() else sysdev.resolve().parent / "queue"
        out["device"] = sysdev.resolve().name
        for name in ("read_ahead_kb", "max_sectors_kb", "nr_requests", "rotational", "scheduler"):
            p = queue / name
            if p.exists():
                out[name] = p.read_text().strip()
    except OSError as e:
        out["error"] = str(e)
    try:
        out["mounts"] = subprocess.run(["df", "-hT", str(path)], capture_output=True, text=True).stdout
    except OSError:
        pass
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp/disk_ceiling")
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--files", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=RESULTS, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    big, paths = make_data(Path(args.dir), args.gib, args.files)
    out: dict = {"config": vars(args), "queue": queue_settings(big), "file_bytes": sum(p.stat().st_size for p in paths)}
    cells = {"dd": lambda: dd_read(big)}
    for mode in ("direct", "buffered"):
        for threads in (1, 4, 16):
            cells[f"pread_{mode}_{threads}"] = lambda m=mode, t=threads: parallel_read(big, t, m == "direct", CHUNK)
    cells["files_one_at_a_time"] = lambda: read_files(paths, 1)
    cells["files_threads_16"] = lambda: read_files(paths, 16)
    for r in range(args.rounds):
        for name, cell in cells.items():
            out["cache_drop"] = drop_cache([str(big), *map(str, paths)])
            rate = cell()
            out.setdefault(name, []).append(rate)
            print(f"round {r}: {name}: {rate / 1e6:,.0f} MB/s", flush=True)
    # per round: the fastest read of the large file over that round's files one at a time
    rounds = [max(out[k][r] for k in cells if not k.startswith("files")) / out["files_one_at_a_time"][r]
              for r in range(args.rounds)]  # fmt: skip
    out["most_vs_files_one_at_a_time"] = rounds
    out["dd_vs_files_one_at_a_time"] = [d / f for d, f in zip(out["dd"], out["files_one_at_a_time"], strict=True)]
    print("most / files one at a time, per round: " + ", ".join(f"{x:.2f}" for x in rounds))
    print(f"wrote {write_result('disk_ceiling', out, {}, args.out)}")


if __name__ == "__main__":
    main()
