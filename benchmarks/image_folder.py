"""ImageFolderDataModule vs torchvision's ImageFolder (RandomResizedCrop, flip, ToTensor, Normalize): the loader
alone, same worker count, same batch size, pinned, measured side by side in one run.

    python benchmarks/image_folder.py                       # defaults: 8,000 demo JPEGs, workers = usable CPUs
    python benchmarks/image_folder.py --images 1000 --workers 2 --batches 10 --out /tmp

Bar (issue 2): ImageFolderDataModule >= 1.3x the images/s of torchvision's ImageFolder at the same num_workers.
"""

from __future__ import annotations

import time

import torch
from _common import demo_tree, parser_for
from torch.utils.data import DataLoader

from lightning_gpu_boost.baselines import plain_image_folder
from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.datamodules import ImageFolderDataModule


def loader_images_per_s(loader: DataLoader, warmup: int, batches: int) -> float:
    """Images/s of iterating ``loader`` for ``batches`` batches after ``warmup`` (across epochs if needed)."""
    seen = 0
    it = iter(loader)
    start = None
    for i in range(warmup + batches):
        try:
            images, _ = next(it)
        except StopIteration:
            it = iter(loader)
            images, _ = next(it)
        if i == warmup - 1 or (warmup == 0 and start is None):
            start = time.perf_counter()
            continue
        if start is not None:
            seen += images.shape[0]
    return seen / (time.perf_counter() - start)


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument(
        "--workers", type=int, nargs="+", default=None, help="worker counts (default: usable CPUs)"
    )
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batches", type=int, default=40, help="timed batches per loader")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed batches (default: 2 per worker + 2)"
    )
    args = parser.parse_args()

    root = demo_tree(args)
    worker_counts = args.workers or [usable_cpus()]
    figures: dict = {
        "images": args.images,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "runs": {},
    }
    bars = {}
    for workers in worker_counts:
        warmup = args.warmup if args.warmup is not None else 2 * workers + 2
        common = {
            "batch_size": args.batch_size,
            "num_workers": workers,
            "pin_memory": torch.cuda.is_available(),
        }
        if workers:
            common.update(persistent_workers=True, prefetch_factor=4)
        plain = DataLoader(plain_image_folder(root, args.image_size), shuffle=True, **common)
        ours = ImageFolderDataModule(
            str(root), image_size=args.image_size, batch_size=args.batch_size, num_workers=workers,
            pin_memory=common["pin_memory"], prefetch_factor=4,
        ).train_dataloader()  # fmt: skip
        plain_ips = loader_images_per_s(plain, warmup, args.batches)
        del plain
        ours_ips = loader_images_per_s(ours, warmup, args.batches)
        del ours
        ratio = ours_ips / plain_ips
        figures["runs"][f"workers_{workers}"] = {
            "torchvision_imagefolder_img_s": plain_ips, "image_folder_datamodule_img_s": ours_ips, "ratio": ratio,
        }  # fmt: skip
        bars[f"image_folder_vs_torchvision_at_{workers}_workers"] = bar(ratio, 1.3, "x")
        print(f"workers={workers}: torchvision {plain_ips:,.0f} img/s, ImageFolderDataModule {ours_ips:,.0f} img/s, "
              f"{ratio:.2f}x")  # fmt: skip
    print(f"wrote {write_result('image_folder', figures, bars, args.out)}")


if __name__ == "__main__":
    main()
