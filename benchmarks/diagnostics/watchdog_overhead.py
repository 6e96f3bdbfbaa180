"""Diagnosis: what GPUUtilWatchdog costs a training run now that it also samples SM activity (NVML GPM) and counts
one step's FLOPs (MFU), measured side by side and interleaved (off, on, off, on, ...) in one run:

- ``resident``: ResNet-50 bf16 on a batch already on the GPU (the ceiling: any GPU-side cost of GPM shows here);
- ``loader``: ResNet-50 bf16 from ``ImageFolderDataModule`` with ``StreamPrefetch()`` and every usable CPU as a
  worker (a CPU-bound loader: any host-side cost shows here).

Each case is timed by ``ThroughputMeter`` in steady state (the timing rule); the figure is the ratio with the
watchdog to without, per pair, and their median.

    cd benchmarks/diagnostics && python watchdog_overhead.py --data /tmp/bench-data
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _common import RESULTS

from lightning_gpu_boost.callbacks import GPUUtilWatchdog, StreamPrefetch
from lightning_gpu_boost.cli.demo import _fit
from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.core.steady import ResidentBatches
from lightning_gpu_boost.datamodules import ImageFolderDataModule
from lightning_gpu_boost.models import ImageClassifier


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/tmp/bench-data")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    root = make_jpeg_folder(f"{args.data}/jpeg-64000-100", n=64000, num_classes=100, progress=False)
    batch = (torch.randint(0, 256, (256, 3, 224, 224), dtype=torch.uint8, device="cuda"),
             torch.randint(0, 100, (256,), device="cuda"))  # fmt: skip

    def run(case: str, watchdog: bool) -> dict:
        torch.manual_seed(0)
        model = ImageClassifier("resnet50", 100, channels_last=True)
        callbacks: tuple = (GPUUtilWatchdog(on_starvation="ignore", summary=False),) if watchdog else ()
        if case == "resident":
            data = ResidentBatches(batch, 250)
        else:
            data = ImageFolderDataModule(str(root), image_size=224, batch_size=256, num_workers=usable_cpus())
            callbacks = (*callbacks, StreamPrefetch())
        out = _fit(model, data, "bf16-mixed", args.steps, 8, callbacks)
        if watchdog:
            dog = callbacks[0]
            out["mfu"] = dog.summaries[0]["mfu"] if dog.summaries else None
            out["sm_active"] = dog.summaries[0]["sm_active"] if dog.summaries else None
        print(f"{case} watchdog={watchdog}: {out['samples_per_s']:,.0f} img/s", flush=True)
        return out

    figures: dict = {}
    for case in ("resident", "loader"):
        pairs = []
        for _ in range(args.pairs):
            off, on = run(case, False), run(case, True)
            pairs.append({"off": off["samples_per_s"], "on": on["samples_per_s"],
                          "ratio": on["samples_per_s"] / off["samples_per_s"],
                          "mfu": on.get("mfu"), "sm_active": on.get("sm_active")})  # fmt: skip
        figures[case] = {"pairs": pairs, "median_ratio": statistics.median(p["ratio"] for p in pairs)}
    bars = {f"{case}_with_watchdog_vs_without": bar(figures[case]["median_ratio"], 0.99, "x") for case in figures}
    print(write_result("watchdog_overhead", figures, bars, RESULTS))


if __name__ == "__main__":
    main()
