"""Diagnosis: where packing ~100 KB records goes, in LMDB alone (no files read): 2,000 random records of 100 KB
stored in 1,000-record commits into a fresh file, then fsynced, with `writemap` (the packer's choice: records are
copied into the file's memory-mapped pages, each page first touched by a page fault), with the map pre-faulted
per commit (`MADV_POPULATE_WRITE`, Linux 5.14+, over the next commit's span), and without `writemap` (LMDB's own
buffers, then `write()`). Each case runs `--repeats` times in this one process, in turn; the first run of a process
also pays for page-cache memory the kernel has not handed out before.

    python benchmarks/diagnostics/lmdb_pack_writemap.py --dir /tmp --repeats 3
    python benchmarks/diagnostics/lmdb_pack_writemap.py --cases no_writemap writemap    # another case first
"""

from __future__ import annotations

import argparse
import ctypes
import os
import struct
import time


def mapping_start(path: str) -> int | None:
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == real:
                return int(fields[0].split("-")[0], 16)
    return None


def store(path: str, values: list[bytes], writemap: bool, populate: bool) -> tuple[float, float]:
    """Seconds storing ``values`` and seconds syncing."""
    import lmdb

    for f in (path, f"{path}-lock"):
        if os.path.exists(f):
            os.remove(f)
    os.sync()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start = time.perf_counter()
    env = lmdb.open(path, subdir=False, map_size=1 << 31, sync=False, metasync=False, writemap=writemap, max_dbs=2)
    db = env.open_db(b"records")
    base = mapping_start(path) if populate else None
    for lo in range(0, len(values), 1000):
        chunk = values[lo : lo + 1000]
        if base is not None:
            used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
            libc.madvise(ctypes.c_void_p(base + used), sum(len(v) + 64 for v in chunk) + (1 << 20), 23)
        with env.begin(write=True) as txn:
            txn.cursor(db=db).putmulti([(struct.pack(">Q", lo + i), v) for i, v in enumerate(chunk)], append=True)
    stored = time.perf_counter()
    env.sync(True)
    env.close()
    return stored - start, time.perf_counter() - stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=["writemap", "writemap_populate", "no_writemap"],
                        help="cases in the order they run (the first pays the process's first-run cost)")
    args = parser.parse_args()
    values = [os.urandom(args.size) for _ in range(args.records)]
    path = os.path.join(args.dir, "lmdb_pack_writemap.lmdb")
    cases = {"writemap": (True, False), "writemap_populate": (True, True), "no_writemap": (False, False)}
    for k in range(args.repeats):
        for name in args.cases:
            writemap, populate = cases[name]
            put, sync = store(path, values, writemap, populate)
            print(f"run {k} {name}: store {put:.3f} s, sync {sync:.3f} s, total {put + sync:.3f} s", flush=True)
    for f in (path, f"{path}-lock"):
        if os.path.exists(f):
            os.remove(f)


if __name__ == "__main__":
    main()
