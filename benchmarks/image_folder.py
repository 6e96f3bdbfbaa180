"""ImageFolderDataModule vs torchvision's ImageFolder (RandomResizedCrop, flip, ToTensor, Normalize): the loader
alone, same worker count, same batch size, pinned, measured side by side in one run.

    python benchmarks/image_folder.py                       # defaults: 8,000 demo JPEGs, workers = usable CPUs
    python benchmarks/image_folder.py --images 1000 --workers 2 --batches 10 --out /tmp

Bar (issue 2): ImageFolderDataModule >= 1.3x the images/s of torchvision's ImageFolder at the same num_workers.
"""

from __future__ import annotations

import torch
from _common import demo_tree, parser_for
from torch.utils.data import DataLoader

from lightning_gpu_boost.baselines import plain_image_folder
from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.loader_rate import clone_loader, measure_loader
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.core.steady import worst_halves_diff
from lightning_gpu_boost.datamodules import ImageFolderDataModule


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument(
        "--workers", type=int, nargs="+", default=None, help="worker counts (default: usable CPUs)"
    )
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--seconds", type=float, default=4.0, help="shortest timed window per loader")
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
        common = {
            "batch_size": args.batch_size,
            "num_workers": workers,
            "pin_memory": torch.cuda.is_available(),
        }
        if workers:
            common.update(persistent_workers=True, prefetch_factor=4)
        plain = DataLoader(plain_image_folder(root, args.image_size), shuffle=True, **common)
        dm = ImageFolderDataModule(
            str(root), image_size=args.image_size, batch_size=args.batch_size, num_workers=workers,
            pin_memory=common["pin_memory"], prefetch_factor=4,
        )  # fmt: skip
        with dm.loaders_as_in_a_trainer():  # uint8 out, as training gets it
            ours = dm.train_dataloader()
        # the timing rule (core/steady.py): the queue skipped, endless batches, halves compared
        plain_w = measure_loader(clone_loader(plain, workers, 4), workers, cap_s=120, min_window_s=args.seconds)
        ours_w = measure_loader(clone_loader(ours, workers, 4), workers, cap_s=120, min_window_s=args.seconds)
        plain_ips, ours_ips = plain_w.rate * args.batch_size, ours_w.rate * args.batch_size
        del plain, ours
        ratio = ours_ips / plain_ips
        figures["runs"][f"workers_{workers}"] = {
            "torchvision_imagefolder_img_s": plain_ips, "image_folder_datamodule_img_s": ours_ips, "ratio": ratio,
            "torchvision_window": plain_w.as_dict(), "image_folder_window": ours_w.as_dict(),
        }  # fmt: skip
        bars[f"image_folder_vs_torchvision_at_{workers}_workers"] = bar(ratio, 1.3, "x")
        print(f"workers={workers}: torchvision {plain_ips:,.0f} img/s{plain_w.flag()}, ImageFolderDataModule "
              f"{ours_ips:,.0f} img/s{ours_w.flag()}, {ratio:.2f}x")  # fmt: skip
    bars["steady_state_halves_max_diff"] = bar(worst_halves_diff(figures), 0.05, "ratio", higher_is_better=False)
    print(f"wrote {write_result('image_folder', figures, bars, args.out)}")


if __name__ == "__main__":
    main()
