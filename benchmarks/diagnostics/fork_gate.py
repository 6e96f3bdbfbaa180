"""Diagnosis: forking a process whose other threads read an LMDB pack (DALI's reading threads, the read-ahead
thread), and what the fork gate of ``core/lmdb/reader.py`` costs a read.

py-lmdb's ``Environment.close()`` waits for the calls other threads are in; a forked child inherits them
unfinished, so a worker that closed its parent's environment (it must, to open the file again) waited for ever.
Cells:

- ``children_hung_raw``: children forked while two threads read the pack straight through py-lmdb (no gate),
  each child then reading one record through ``PackReader``: how many did not finish in ``--child-timeout`` s;
- ``children_hung_gated``: the same with the threads reading through ``PackReader.read`` (the gate);
- ``read_us_gated`` / ``read_us_raw``: one record read and its CRC checked, through ``PackReader.read`` and through
  ``txn.get`` + ``decode_record`` (the read before the gate), best of the rounds, warm, 4 KB records; the same for
  the demo's ~77 KB JPEGs (``..._77KB``), with the payload copied out as a DALI feeder does.

    cd benchmarks/diagnostics && python fork_gate.py --data /tmp/demo
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

from _common import RESULTS, demo_tree
from bigger_than_ram import small_records

from lightning_gpu_boost.core.lmdb import KEY, decode_record, pack_image_folder, sharded
from lightning_gpu_boost.core.results import write_result


def hung_children(pack: str, n: int, timeout: float, gated: bool) -> int:
    reader, stop = sharded.open_pack(pack), threading.Event()
    reader.read(0)

    def spin() -> None:
        i = 0
        txn = reader._txn()
        while not stop.is_set():
            if gated:
                reader.read(i % len(reader))
            else:
                txn.get(KEY.pack(i % len(reader)))
            i += 1

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    hung = 0
    for k in range(n):
        pid = os.fork()
        if pid == 0:
            sharded.open_pack(pack).read(k % len(reader))
            os._exit(0)
        deadline = time.monotonic() + timeout
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() > deadline:
                hung += 1
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            time.sleep(0.002)
    stop.set()
    for t in threads:
        t.join()
    return hung


def read_us(pack: str, rounds: int, reads: int, copy: bool = False) -> tuple[float, float]:
    reader = sharded.open_pack(pack)
    n, nothing = len(reader), (lambda r: bytes(r.payload)) if copy else (lambda r: None)
    txn = reader._txn()
    gated = raw = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for i in range(reads):
            reader.read(i % n, nothing)
        gated = min(gated, (time.perf_counter() - t) / reads * 1e6)
        t = time.perf_counter()
        for i in range(reads):
            nothing(decode_record(i % n, txn.get(KEY.pack(i % n)), True))
        raw = min(raw, (time.perf_counter() - t) / reads * 1e6)
    return gated, raw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/tmp/demo")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--images", type=int, default=2000, help="demo JPEGs (100 classes) for the 77 KB cell")
    parser.add_argument("--children", type=int, default=8)
    parser.add_argument("--child-timeout", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=RESULTS, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    _, pack = small_records(Path(args.data), args.records)
    gated_us, raw_us = read_us(str(pack), args.rounds, 50_000)
    jpegs = Path(args.data) / f"fork-gate-jpeg-{args.images}.lmdb"
    if not jpegs.exists():
        pack_image_folder(demo_tree(args), jpegs)
    gated_77, raw_77 = read_us(str(jpegs), args.rounds, 20_000, copy=True)
    figures = {
        "children": args.children,
        "child_timeout_s": args.child_timeout,
        "children_hung_raw": hung_children(str(pack), args.children, args.child_timeout, gated=False),
        "children_hung_gated": hung_children(str(pack), args.children, args.child_timeout, gated=True),
        "read_us_gated": round(gated_us, 3),
        "read_us_raw": round(raw_us, 3),
        "gate_cost_us": round(gated_us - raw_us, 3),
        "read_us_gated_77KB": round(gated_77, 3),
        "read_us_raw_77KB": round(raw_77, 3),
        "gate_cost_of_read_77KB": round(gated_77 / raw_77 - 1, 4),
    }
    print(figures)
    print(f"wrote {write_result('fork_gate', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
