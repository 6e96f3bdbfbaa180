"""The documented one-line change on the plain-Lightning JPEG case, side by side in one run on the GPU machine.

    python benchmarks/gpu_boost.py

Steady-state throughput (the rule of ``core/steady.py``): ThroughputMeter skips at least the loader's queue
(16 workers x prefetch 4 = 64 batches after AutoNumWorkers) plus a few steps, and every case records the rates
of its window's halves; the window opens once the queue has drained (steps wait for data) and holds ``--steps``
steps. All of it stays inside the first epoch (64,000 demo images, 250 batches; the same tree as
``lightning-gpu-boost bench``): an epoch boundary stalls while the workers refill.

Plain: torchvision ImageFolder (RandomResizedCrop, flip, ToTensor, Normalize), DataLoader defaults
(num_workers=0), Trainer defaults (fp32). Boosted: the same script plus
``callbacks=[GPUBoost()], precision=recommended_precision()``. Bars (issue 23): boosted >= 10x plain at steady state; every case's halves within 5 %.
Also measured: boosted with ``GPUBoost(move_normalize=False)`` (ToTensor + Normalize stay in the workers).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from _common import demo_tree, parser_for
from torch.utils.data import DataLoader

from lightning_gpu_boost.baselines import plain_image_folder
from lightning_gpu_boost.callbacks import GPUBoost
from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.core.steady import worst_halves_diff
from lightning_gpu_boost.models import ImageClassifier
from lightning_gpu_boost.strategies import recommended_precision


def per_epoch(args) -> int:
    return -(-args.images // args.batch_size)


def run(root, args, boosted: bool, gpu_normalize: bool = True) -> dict:
    torch.manual_seed(0)
    loader = DataLoader(
        plain_image_folder(root, 224), batch_size=args.batch_size, shuffle=True
    )  # the user's loader
    meter = ThroughputMeter(warmup=args.warmup, steps=args.steps if boosted else args.plain_steps)
    extra = (
        {"callbacks": [meter, GPUBoost(move_normalize=gpu_normalize)], "precision": recommended_precision()}
        if boosted
        else {"callbacks": [meter]}
    )
    trainer = pl.Trainer(
        devices=1, max_steps=per_epoch(args), logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **extra,
    )  # fmt: skip
    trainer.fit(ImageClassifier("resnet50", num_classes=100), loader)
    result = {**meter.summary(), "precision": str(trainer.precision), "num_workers": loader.num_workers}
    if boosted:
        boost = next(c for c in trainer.callbacks if isinstance(c, GPUBoost))
        result["num_workers"] = boost.parts["auto_workers"].chosen.get("train")
        result["watchdog"] = boost.parts["watchdog"].summaries
        result["moved_normalize"] = boost.parts["prefetch"].moved_normalize
    return result


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--plain-steps", type=int, default=40)
    parser.add_argument("--steps", type=int, default=64, help="timed steps once the loader's queue has drained")
    parser.set_defaults(images=64000)  # 250 batches: warm-up, the queue's drain and the window fit in one epoch
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu_boost.py needs a CUDA GPU.")
    root = demo_tree(args)
    plain = run(root, args, boosted=False)
    boosted = run(root, args, boosted=True)
    float_workers = run(root, args, boosted=True, gpu_normalize=False)
    speedup = boosted["samples_per_s"] / plain["samples_per_s"]
    print(f"plain {plain['samples_per_s']:,.0f} img/s, GPUBoost {boosted['samples_per_s']:,.0f} img/s "
          f"({boosted['num_workers']} workers, {boosted['precision']}): {speedup:.2f}x; with gpu_normalize=False "
          f"{float_workers['samples_per_s']:,.0f} img/s")  # fmt: skip
    figures = {"config": vars(args), "plain": plain, "boosted": boosted, "speedup": speedup,
               "boosted_gpu_normalize_off": float_workers,
               "gpu_normalize_gain": boosted["samples_per_s"] / float_workers["samples_per_s"]}  # fmt: skip
    halves = worst_halves_diff([plain, boosted, float_workers])
    for name, r in (("plain", plain), ("boosted", boosted), ("gpu_normalize=False", float_workers)):
        print(f"  {name}: {r['samples_per_s']:,.0f} img/s over {r['steps']} steps after {r['warmup_steps']} "
              f"(queue {r['queue_batches']}), halves {r['first_half']:,.0f} / {r['second_half']:,.0f}")  # fmt: skip
    bars = {
        "one_line_change_speedup": bar(speedup, 10.0, "x"),
        "steady_state_halves_max_diff": bar(halves, 0.05, "ratio", higher_is_better=False),
    }
    print(f"wrote {write_result('gpu_boost', figures, bars, args.out)}")


if __name__ == "__main__":
    main()
