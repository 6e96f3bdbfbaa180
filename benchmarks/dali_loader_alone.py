"""Diagnosis: DALILoader alone (no training): batches/s and the main thread's time per ``next()``.

    python benchmarks/dali_loader_alone.py
"""

from __future__ import annotations

import time

import torch
from _common import demo_tree, parser_for

from lightning_gpu_boost.datamodules.dali import DALIDataModule


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--batches", type=int, default=64)
    args = parser.parse_args()
    root = demo_tree(args)
    for load in (0.65, 0.99):
        dm = DALIDataModule(str(root), batch_size=args.batch_size, dtype="bfloat16", channels_last=True,
                            hw_decoder_load=load)  # fmt: skip
        loader = dm.train_dataloader()
        it = iter(loader)
        for _ in range(8):
            next(it)
        torch.cuda.synchronize()
        t0, cpu0, main_s = time.perf_counter(), time.process_time(), 0.0
        for _ in range(args.batches):
            t = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                it = iter(loader)
                next(it)
            main_s += time.perf_counter() - t
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        print(f"hw_decoder_load={load}: {args.batches * args.batch_size / wall:,.0f} img/s alone, "
              f"main thread {1000 * main_s / args.batches:.1f} ms per next(), "
              f"{(time.process_time() - cpu0) / wall:.1f} CPU cores")  # fmt: skip
        dm.teardown("fit")


if __name__ == "__main__":
    main()
