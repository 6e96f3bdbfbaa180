"""Train the same model on the same ``DataLoader`` with plain Lightning defaults and with the README's one line,
``GPUBoost()``; print the speed-up.

The data is a generated ImageNet-like JPEG tree (cached), read by torchvision's ``ImageFolder`` with Lightning's
ImageNet example's transforms. On a GPU with torchvision the model is ResNet-50 (batch 256, 224 px); on a CPU a small
CNN (batch 32, 128 px) keeps the demo short.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any

from lightning_gpu_boost.cli._args import at_least, writable_folder

__all__ = ['add_arguments', 'run']


def _defaults(gpu: bool, has_torchvision: bool) -> dict[str, Any]:
    if gpu and has_torchvision:
        return {
            "arch": "resnet50",
            "images": 8000,
            "batch_size": 256,
            "image_size": 224,
            "steps": 30,
            "warmup": 5,
        }
    return {"arch": "small_cnn", "images": 640, "batch_size": 32, "image_size": 128, "steps": 12, "warmup": 3}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", default=os.environ.get("LGB_DEMO_DATA", ".demo-data"), help="demo data folder"
    )
    parser.add_argument("--images", type=at_least(1), help="number of generated JPEGs (at least --classes)")
    parser.add_argument("--classes", type=at_least(1), default=100, help="class folders (default 100)")
    parser.add_argument("--batch-size", type=at_least(1))
    parser.add_argument("--image-size", type=at_least(16), help="pixels per side (at least 16)")
    parser.add_argument("--steps", type=at_least(1), help="timed training steps per run")
    parser.add_argument("--warmup", type=at_least(0), help="untimed steps before timing")
    parser.add_argument("--arch", choices=["small_cnn", "resnet50"])
    parser.add_argument("--out", help="also write <out>/demo-<date>-<gpu>.json and a Markdown table beside it")
    parser.set_defaults(func=run)


def _fit(model, data, precision: str, steps: int, warmup: int, callbacks: tuple = ()) -> dict[str, Any]:
    """Train ``steps`` steps after the warm-up and the loader's queue (``core/steady.py``); the meter's summary."""
    from lightning_gpu_boost.doctor import measure_fit

    return measure_fit(model, data, steps, warmup, callbacks, precision=precision)


def run(args: argparse.Namespace) -> int:
    from lightning_gpu_boost._logging import lightning_level

    with lightning_level(logging.WARNING):  # Lightning's INFO lines around the table; as they were after it
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import torch  # here, not at import: a mistyped argument is reported before torch loads
    from torch.utils.data import DataLoader

    from lightning_gpu_boost._imports import module_available
    from lightning_gpu_boost.baselines import plain_image_folder
    from lightning_gpu_boost.callbacks import GPUBoost, GPUUtilWatchdog
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.models import ImageClassifier

    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    # the watchdog's message is printed under the table, once
    warnings.filterwarnings("ignore", module=r"lightning_gpu_boost\.callbacks\.gpu_util_watchdog")
    gpu = torch.cuda.is_available()
    cfg = _defaults(gpu, module_available("torchvision"))
    for key in ("arch", "images", "batch_size", "image_size", "steps", "warmup"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if cfg["images"] < args.classes:
        given = "--images" if args.images is not None else "the default --images"
        raise SystemExit(f"{given} {cfg['images']} is fewer than --classes {args.classes}: each class folder needs an "
                         "image; raise --images or lower --classes.")  # fmt: skip
    if args.out:
        writable_folder("--out", args.out)
    root = Path(args.data) / f"jpeg-{cfg['images']}-{args.classes}"
    make_jpeg_folder(root, n=cfg["images"], num_classes=args.classes)
    device = torch.cuda.get_device_name(0) if gpu else "CPU"
    print(f"demo: {cfg['arch']} on {device}, batch {cfg['batch_size']}, {cfg['image_size']} px, "
          f"{cfg['steps']} timed steps after {cfg['warmup']} warm-up, data {root}")  # fmt: skip

    def user_loader() -> DataLoader:  # the user's own loader, as written: both runs get a fresh one
        return DataLoader(plain_image_folder(root, cfg["image_size"]), batch_size=cfg["batch_size"], shuffle=True)

    torch.manual_seed(0)
    plain_watchdog = GPUUtilWatchdog(window=10, warmup_steps=cfg["warmup"], on_starvation="ignore", summary=False)
    plain = _fit(
        ImageClassifier(cfg["arch"], args.classes), user_loader(), "32-true", cfg["steps"], cfg["warmup"],
        (plain_watchdog,),
    )

    torch.manual_seed(0)
    # the README's one line (its watchdog reports here, under the table), with recommended_precision()
    precision = "bf16-mixed" if gpu and torch.cuda.is_bf16_supported() else "32-true"
    boost = GPUBoost(workers_budget_s=20, on_starvation="ignore")
    watchdog = boost.parts["watchdog"]
    boosted = _fit(ImageClassifier(cfg["arch"], args.classes), user_loader(), precision, cfg["steps"], cfg["warmup"],
                   (boost,))  # fmt: skip
    workers = boost.parts["auto_workers"].chosen.get("train", 0)
    speedup = boosted["samples_per_s"] / plain["samples_per_s"]
    # one voice: the data wait and utilization columns are each run's GPUUtilWatchdog summary, the figures the
    # watchdog's line below judges by (the meter's samples/s is its steady window)
    for r, dog in ((plain, plain_watchdog), (boosted, watchdog)):
        if dog.summaries:
            s = dog.summaries[0]
            r["data_wait_frac"] = s["data_wait_frac"]
            r["gpu_util"] = None if math.isnan(s["gpu_util"]) else s["gpu_util"]
    rows = [("plain Lightning defaults", "32-true", 0, plain), ("GPUBoost(), the one line", precision, workers, boosted)]

    def util(r: dict[str, Any]) -> str:
        return "n/a" if r["gpu_util"] is None else f"{r['gpu_util']:.0f} %"

    print()
    print("| setup | precision | workers | samples/s | data wait | GPU util |")
    print("|---|---|---|---|---|---|")
    for name, prec, workers, r in rows:
        flag = "" if r.get("steady", True) else f" (not steady: halves {100 * r['halves_diff']:.0f} % apart)"
        print(
            f"| {name} | {prec} | {workers} | {r['samples_per_s']:,.0f}{flag} | {100 * r['data_wait_frac']:.0f} % "
            f"| {util(r)} |"
        )
    print(f"\nspeed-up: {speedup:.2f}x")
    if not gpu:
        print("No CUDA GPU: the one line keeps a GPU busy, and here there is none; the step and the loaders share this "
              "machine's CPUs, so the figure moves with whatever else runs on it. On a GPU machine it measures what "
              "the package does.")  # fmt: skip
    if watchdog.warnings:
        print(f"\nGPUUtilWatchdog on the boosted run says:\n{watchdog.warnings[-1]['message']}")
    if args.out:
        from lightning_gpu_boost.core.results import bar, write_result
        from lightning_gpu_boost.core.steady import worst_halves_diff

        probe = boost.parts["auto_workers"].probes.get("train")
        boosted.update(precision=precision, num_workers=workers, num_workers_probe=probe.as_dict() if probe else None)
        figures = {"config": cfg, "plain": plain, "boosted": boosted, "speedup": speedup}
        bars = {
            "speedup_vs_plain": bar(speedup, 1.0, "x"),
            "steady_state_halves_max_diff": bar(
                worst_halves_diff({"plain": plain, "boosted": boosted}), 0.05, "ratio", higher_is_better=False
            ),
        }
        path = write_result("demo", figures, bars, args.out)
        print(f"wrote {path}")
    return 0
