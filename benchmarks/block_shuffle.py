"""How random the block-shuffled order is, against a full shuffle and key order, on the layout of a real pack.

    python benchmarks/block_shuffle.py --out /tmp          # seconds, no GPU, no data needed

A pack holds its records in the order the folders were scanned: class by class, unless it was packed with
``--shuffle-seed`` (the ``_shuffled_pack`` layouts). Each order is scored by
:func:`~lightning_gpu_boost.core.block_shuffle.order_stats` over one epoch: distinct labels per batch, the entropy of a
batch's labels, and the correlation between a sample's position in the epoch and its record index. Layouts: the
64,000-image demo tree (100 classes, ~71 KiB records: 59 records per 4 MiB block) and ImageNet-1k's train split
(1,281,167 images, 1,000 classes, ~110 KiB records: 38 per block), both packed class by class, batch 256.

Bars (issue 19, the order's randomness, documented rather than targeted): none; the figures are reported.
"""

from __future__ import annotations

import argparse

import numpy as np

from lightning_gpu_boost.core.block_shuffle import block_order, block_size_for, order_stats
from lightning_gpu_boost.core.results import write_result

LAYOUTS = {
    "demo_64k": {"records": 64_000, "classes": 100, "record_bytes": 71 * 1024},
    "imagenet_1k": {"records": 1_281_167, "classes": 1_000, "record_bytes": 110 * 1024},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--block-bytes", type=int, default=4 << 20)
    parser.add_argument("--windows", type=int, nargs="+", default=[4, 16, 64], help="window_blocks values")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    figures: dict = {"config": vars(args), "layouts": {}}
    for name, layout in [(f"{k}{suffix}", {**v, "shuffled_pack": bool(suffix)})
                         for k, v in LAYOUTS.items() for suffix in ("", "_shuffled_pack")]:  # fmt: skip
        n, classes = layout["records"], layout["classes"]
        labels = np.repeat(np.arange(classes), -(-n // classes))[:n]  # packed class by class
        if layout["shuffled_pack"]:  # lightning-gpu-boost pack --shuffle-seed 0: records in a random order
            labels = labels[np.random.default_rng(1).permutation(n)]
        block = block_size_for(n, n * layout["record_bytes"], args.block_bytes)
        rng = np.random.default_rng(0)
        rows = {"key_order": order_stats(range(n), labels, args.batch_size),
                "full_shuffle": order_stats(rng.permutation(n), labels, args.batch_size)}  # fmt: skip
        for window in args.windows:
            rows[f"block_w{window}"] = order_stats(block_order(n, block, window, seed=0, epoch=0), labels,
                                                   args.batch_size)  # fmt: skip
        figures["layouts"][name] = {**layout, "block_size": block, "orders": rows}
        print(f"{name} (block {block} records):")
        for order, stats in rows.items():
            print(f"  {order:>13}: {stats['labels_per_batch']:6.1f} labels per batch, entropy "
                  f"{stats['label_entropy']:.2f} bits, position corr {stats['position_corr']:.3f}")  # fmt: skip
    print(f"wrote {write_result('block_shuffle', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
