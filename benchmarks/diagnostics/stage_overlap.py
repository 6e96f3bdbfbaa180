"""Diagnosis: how much of a GPU transform stage's own time the step pays when the stage runs on the side stream.

    cd benchmarks/diagnostics && python stage_overlap.py --out /tmp

The segmentation pipeline of ``benchmarks/gpu_transforms.py`` (U-Net, batch 16, ``JointAugment(size=512,
degrees=30, elastic=0.05, jitter=0.3)`` on 640-px image + mask pairs), a raw batch resident on the GPU so that only
the stage and the step run; variants interleaved ``--rounds`` times (medians):

- ``alone``: the step on the transformed batch, no stage (the compute);
- ``shared``: ``StreamPrefetch(transform=...)`` with the step on the default stream, as the same priority as the
  side stream (both the lowest);
- ``priority``: the same with the training loop on a high-priority stream (``HighPriorityStep`` below): the
  stage's blocks are scheduled first only where the step leaves SMs free; ``priority_depth2``: two batches ahead.

Measured on the H100 at e9f4da2 (where this switch was a ``StreamPrefetch(step_priority=)`` option, taken out
again for lack of effect; ``benchmarks/results/stage_overlap-2026-11-24-h100.json``): stage 1.48 ms, extra 0.46
of it shared, 0.49 with the step at high priority, 0.53 at depth 2. The U-Net step keeps the SMs busy: block
priority cannot make room that the step does not leave.

``extra_of_stage`` = (step with the stage - compute alone) / the stage's own GPU time.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "workloads"))
sys.path.insert(1, str(HERE.parents[1]))

import lightning.pytorch as pl  # noqa: E402
import segmentation as seg  # noqa: E402
from lightning.fabric.utilities.apply_func import move_data_to_device  # noqa: E402

from lightning_gpu_boost.callbacks import StreamPrefetch  # noqa: E402
from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter  # noqa: E402
from lightning_gpu_boost.core.gpu_transforms import JointAugment  # noqa: E402
from lightning_gpu_boost.core.results import environment  # noqa: E402
from lightning_gpu_boost.core.steady import ResidentBatches  # noqa: E402


class HighPriorityStep(pl.Callback):
    """The training loop on a high-priority CUDA stream (the side stream keeps the lowest, default priority)."""

    def __init__(self) -> None:
        self.stream = self.previous = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.stream = torch.cuda.Stream(priority=-100)  # the most negative: the highest the device has
        self.previous = torch.cuda.current_stream()
        self.stream.wait_stream(self.previous)
        torch.cuda.set_stream(self.stream)

    def on_train_end(self, trainer, pl_module) -> None:
        self.previous.wait_stream(self.stream)
        torch.cuda.set_stream(self.previous)


def fit_ms(batch: Any, steps: int, transform=None, step_priority: bool = False, **prefetch: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    cfg = seg.SIZES["gpu"]
    meter = ThroughputMeter(warmup=10, steps=steps - 20, sample_gpu_util=False)
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[meter, StreamPrefetch(transform=transform, transform_seed=0, **prefetch)]
        + ([HighPriorityStep()] if step_priority else []),
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(seg.UNet(cfg["classes"], cfg["width"]), ResidentBatches(batch, steps))
    s = meter.summary()
    return {"step_ms": 1000 * cfg["batch"] / s["samples_per_s"], "halves_diff": s["halves_diff"]}


def stage_ms(transform, batch: Any, repeats: int = 40) -> float:
    for _ in range(5):
        transform(batch)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        transform(batch)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--out", default=".", help="folder for stage_overlap.json")
    args = parser.parse_args()
    cfg = seg.SIZES["gpu"]
    g = torch.Generator().manual_seed(0)
    px, n = cfg["pixels"], cfg["batch"]
    images = torch.randint(0, 256, (n, 3, px, px), dtype=torch.uint8, generator=g)
    masks = torch.randint(0, cfg["classes"], (n, px, px), dtype=torch.int64, generator=g)
    raw = move_data_to_device((images, masks), torch.device("cuda"))
    aug = JointAugment(size=cfg["crop"], degrees=30.0, elastic=0.05, jitter=0.3, ignore_index=0)
    torch.manual_seed(0)
    done = aug(raw)
    variants = {
        "shared": {"step_priority": False},
        "priority": {"step_priority": True},
        "priority_depth2": {"step_priority": True, "depth": 2},
    }
    runs: dict[str, list] = {"alone": [], **{k: [] for k in variants}}
    for _ in range(args.rounds):
        runs["alone"].append(fit_ms(done, args.steps))
        for name, options in variants.items():
            runs[name].append(fit_ms(raw, args.steps, aug, **options))
    stage = stage_ms(aug, raw)
    med = {k: float(np.median([r["step_ms"] for r in v])) for k, v in runs.items()}
    result = {
        "environment": environment(),
        "stage_ms": stage,
        "runs": runs,
        "median_step_ms": med,
        "extra_of_stage": {k: (med[k] - med["alone"]) / stage for k in variants},
    }
    print(json.dumps({k: result[k] for k in ("stage_ms", "median_step_ms", "extra_of_stage")}, indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "stage_overlap.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
