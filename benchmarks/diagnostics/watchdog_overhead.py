"""Diagnosis: what GPUUtilWatchdog costs a training run now that it also samples SM activity (NVML GPM) and counts
one step's FLOPs (MFU), measured side by side and interleaved (off, on, off, on, ...) in one run:

- ``resident``: ResNet-50 bf16 on a batch already on the GPU (the ceiling: any GPU-side cost of GPM shows here);
- ``transformer``: a launch-bound step (a GPT of many narrow layers on a small batch already on the GPU, about 20 ms
  a step spent launching kernels: any per-step host cost of the watchdog's hooks shows here in full);
- ``loader``: ResNet-50 bf16 from ``ImageFolderDataModule`` with ``StreamPrefetch()`` and every usable CPU as a
  worker (a CPU-bound loader: any host-side cost shows here, beside the host's own spread).

Each case is timed by ``ThroughputMeter`` in steady state (the timing rule); the figure is the ratio with the
watchdog to without, per pair, and their median. In each run with the watchdog, the time its hooks take in the
training process is timed too (``hooks_ms_per_step``, its share of the step without the watchdog): on a launch-bound
step every microsecond of it is on the step's path, and unlike a ratio of two runs it does not move with the host
(the H200 machine's launch-bound pairs spread 0.82-1.23x in one run of 2026-11-26). Bars: the watchdog's overhead
bar, at most 0.5 % of step time: ``resident`` >= 0.995x (GPU-side costs: GPM, NVML) over ``--pairs`` (10) alternating
pairs, ``transformer`` hooks <= 0.005 of the step (median over its 10 pairs, their ratios recorded); ``loader``
(``--loader-pairs``, 3) >= 0.99x, a CPU-bound host's spread being wider than the bar.

    cd benchmarks/diagnostics && python watchdog_overhead.py --data /tmp/bench-data
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

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
    parser.add_argument("--pairs", type=int, default=10, help="alternating pairs for resident and transformer")
    parser.add_argument("--loader-pairs", type=int, default=3, help="alternating pairs for loader")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--transformer-steps", type=int, default=256, help="timed steps of the transformer (~5 s)")
    parser.add_argument("--layers", type=int, default=6, help="the transformer's layers (its step's launches)")
    parser.add_argument("--only", nargs="+", choices=["resident", "transformer", "loader"])
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workloads"))
    from tokens_lm import GPT

    tokens = torch.randint(0, 8192, (8, 129), device="cuda")
    batch = (torch.randint(0, 256, (256, 3, 224, 224), dtype=torch.uint8, device="cuda"),
             torch.randint(0, 100, (256,), device="cuda"))  # fmt: skip

    def timed_hooks(dog: GPUUtilWatchdog) -> list[float]:
        """Time every step hook of ``dog`` (Lightning calls them through the instance's attributes)."""
        spent = [0.0]
        for name in ("on_train_batch_start", "on_train_batch_end"):  # its hooks inside the step loop
            hook = getattr(dog, name)

            def timed(*a, _hook=hook, **k):
                start = time.perf_counter()
                try:
                    return _hook(*a, **k)
                finally:
                    spent[0] += time.perf_counter() - start

            setattr(dog, name, timed)
        return spent

    def run(case: str, watchdog: bool) -> dict:
        torch.manual_seed(0)
        callbacks: tuple = (GPUUtilWatchdog(on_starvation="ignore", summary=False),) if watchdog else ()
        steps = args.steps
        if case == "transformer":
            model = GPT(8192, 128, 256, args.layers, 4)
            data, steps = ResidentBatches((tokens[:, :-1], tokens[:, 1:]), 1000), args.transformer_steps
        else:
            model = ImageClassifier("resnet50", 100, channels_last=True)
        if case == "resident":
            data = ResidentBatches(batch, 250)
        elif case == "loader":
            root = make_jpeg_folder(f"{args.data}/jpeg-64000-100", n=64000, num_classes=100, progress=False)
            data = ImageFolderDataModule(str(root), image_size=224, batch_size=256, num_workers=usable_cpus())
            callbacks = (*callbacks, StreamPrefetch())
        spent = timed_hooks(callbacks[0]) if watchdog else None
        out = _fit(model, data, "bf16-mixed", steps, 8, callbacks)
        if watchdog:
            dog = callbacks[0]
            out["hooks_ms_per_step"] = 1000 * spent[0] / max(1, model.trainer.global_step)
            out["mfu"] = dog.summaries[0]["mfu"] if dog.summaries else None
            out["sm_active"] = dog.summaries[0]["sm_active"] if dog.summaries else None
        print(f"{case} watchdog={watchdog}: {out['samples_per_s']:,.0f} samples/s, step {out.get('step_ms')} ms",
              flush=True)  # fmt: skip
        return out

    figures: dict = {"config": vars(args)}
    bars = {}
    for case in args.only or ("resident", "transformer", "loader"):
        pairs = []
        for _ in range(args.loader_pairs if case == "loader" else args.pairs):
            off, on = run(case, False), run(case, True)
            pairs.append({"off": off["samples_per_s"], "on": on["samples_per_s"],
                          "ratio": on["samples_per_s"] / off["samples_per_s"], "step_ms_off": off.get("step_ms"),
                          "mfu": on.get("mfu"), "sm_active": on.get("sm_active"),
                          "hooks_ms_per_step": on["hooks_ms_per_step"],
                          "hooks_frac_of_step": on["hooks_ms_per_step"] / off["step_ms"]})  # fmt: skip
        figures[case] = {"pairs": pairs, "median_ratio": statistics.median(p["ratio"] for p in pairs),
                         "median_hooks_frac_of_step": statistics.median(p["hooks_frac_of_step"] for p in pairs)}
        if case == "transformer":
            bars["transformer_watchdog_hooks_frac_of_step"] = bar(figures[case]["median_hooks_frac_of_step"], 0.005,
                                                                  "share of the step", higher_is_better=False)  # fmt: skip
        else:
            target = 0.99 if case == "loader" else 0.995
            bars[f"{case}_with_watchdog_vs_without"] = bar(figures[case]["median_ratio"], target, "x")
    print(write_result("watchdog_overhead", figures, bars, RESULTS))


if __name__ == "__main__":
    main()
