"""AutoNumWorkers vs an exhaustive sweep and vs a hand-tuned 16-worker loader, side by side in one run.

    python benchmarks/auto_num_workers.py                  # H100 machine defaults (8,000 demo JPEGs, ResNet-50)
    python benchmarks/auto_num_workers.py --images 600 --batch-size 32 --sweep 0 1 2 --sweep-seconds 1 --steps 4 --out /tmp

Bars (issue 5):
- on the demo JPEGs with ImageFolderDataModule, the tuner's choice reaches >= 95 % of the exhaustive sweep's best
  loader throughput, and its probe takes <= 30 s;
- a ResNet-50 Trainer started with num_workers=0 plus AutoNumWorkers reaches >= 95 % of the throughput of the
  hand-tuned 16-worker loader (same DataModule otherwise) measured in the same run.
"""

from __future__ import annotations

import statistics
import time

import lightning.pytorch as pl
import torch
from _common import demo_tree, parser_for

from lightning_gpu_boost.callbacks import AutoNumWorkers, StreamPrefetch
from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
from lightning_gpu_boost.core.images import IMAGENET_MEAN, IMAGENET_STD
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.core.workers import clone_loader, measure_batches_per_s, tune_num_workers
from lightning_gpu_boost.datamodules import ImageFolderDataModule
from lightning_gpu_boost.models import ImageClassifier


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--sweep", type=int, nargs="+", default=[0, 1, 2, 4, 8, 12, 16])
    parser.add_argument(
        "--sweep-seconds", type=float, default=4.0, help="shortest timed window per swept count"
    )
    parser.add_argument("--hand-tuned", type=int, default=16)
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="training pairs, run alternately (auto, hand, ...)")
    parser.add_argument("--arch", default="resnet50" if torch.cuda.is_available() else "small_cnn")
    args = parser.parse_args()
    root = str(demo_tree(args))
    gpu = torch.cuda.is_available()

    def datamodule(workers: int) -> ImageFolderDataModule:
        return ImageFolderDataModule(root, image_size=args.image_size, batch_size=args.batch_size,
                                     num_workers=workers, pin_memory=gpu)  # fmt: skip

    # 1. the tuner alone, timed, then the exhaustive sweep (loader alone)
    start = time.perf_counter()
    probe = tune_num_workers(datamodule(0).train_dataloader(), budget_s=args.budget)
    probe_s = time.perf_counter() - start
    sweep = {}
    for workers in sorted(set(args.sweep) | {probe.num_workers}):
        loader = clone_loader(datamodule(0).train_dataloader(), workers, prefetch_factor=2)
        # the tuner's measurement (whole waves after the startup wave), with a longer window
        rate = measure_batches_per_s(
            loader, workers, cap_s=args.sweep_seconds * 3, min_window_s=args.sweep_seconds
        )
        sweep[workers] = rate * args.batch_size
        print(f"sweep: {workers:>2} workers {sweep[workers]:8,.0f} img/s")
    best = max(sweep, key=sweep.get)
    print(f"tuner: {probe.num_workers} workers in {probe_s:.1f} s\n{probe.format_table()}")

    # 2. training: num_workers=0 + AutoNumWorkers vs the hand-tuned count, same DataModule otherwise
    def train(workers: int, callbacks: list) -> dict:
        torch.manual_seed(0)
        meter = ThroughputMeter(warmup=args.warmup)
        trainer = pl.Trainer(
            accelerator="auto", devices=1, precision="bf16-mixed" if gpu else "32-true",
            max_steps=args.warmup + args.steps, callbacks=[meter, *callbacks], logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, limit_val_batches=0,
        )  # fmt: skip
        model = ImageClassifier(args.arch, num_classes=100, channels_last=gpu)
        trainer.fit(model, datamodule=datamodule(workers))
        return {**meter.summary(), "num_workers": trainer.train_dataloader.num_workers}

    prefetch = [StreamPrefetch(normalize=(IMAGENET_MEAN, IMAGENET_STD), channels_last=True)] if gpu else []
    runs_auto, runs_hand, autos = [], [], []
    for _ in range(args.repeats):  # alternate, so that drift of the machine hits both alike
        autos.append(AutoNumWorkers(budget_s=args.budget, use_cache=False))
        runs_auto.append(train(0, [autos[-1], *prefetch]))
        runs_hand.append(train(args.hand_tuned, list(prefetch)))
    mean_auto = statistics.fmean(r["samples_per_s"] for r in runs_auto)
    mean_hand = statistics.fmean(r["samples_per_s"] for r in runs_hand)
    ratio = mean_auto / mean_hand
    print(f"training: auto ({[r['num_workers'] for r in runs_auto]} workers) {mean_auto:,.0f} img/s, "
          f"hand-tuned ({args.hand_tuned}) {mean_hand:,.0f} img/s (means of {args.repeats}): {ratio:.3f}")  # fmt: skip

    figures = {
        "config": vars(args),
        "tuner": {**probe.as_dict(), "probe_wall_s": probe_s},
        "sweep_img_s": {str(k): v for k, v in sweep.items()},
        "sweep_best_workers": best,
        "train_auto_runs": runs_auto,
        "train_auto_probes": [a.probes["train"].as_dict() for a in autos],
        "train_hand_tuned_runs": runs_hand,
        "train_auto_mean_img_s": mean_auto,
        "train_hand_tuned_mean_img_s": mean_hand,
    }
    bars = {
        "tuner_choice_of_sweep_best": bar(sweep[probe.num_workers] / sweep[best], 0.95, "x"),
        "tuner_probe_seconds": bar(probe_s, 30.0, "s", higher_is_better=False),
        "train_auto_of_hand_tuned": bar(ratio, 0.95, "x"),
    }
    for key, b in bars.items():
        print(f"{key}: {b['value']} (target {b['target']}, pass={b['pass']})")
    print(f"wrote {write_result('auto_num_workers', figures, bars, args.out)}")


if __name__ == "__main__":
    main()
