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

Besides the mean, each run records its typical step's hooks (``hooks_ms_median_step``) and its five slowest
(one-off costs: the first verdict's message, the warm-up's FLOP count), and ``--profile-hooks`` adds one run per
case with the hooks under cProfile (``hooks_profile``: where their time goes; that run is not in the figures).

    cd benchmarks/diagnostics && python watchdog_overhead.py --data /tmp/bench-data
    cd benchmarks/diagnostics && python watchdog_overhead.py --only transformer --pairs 3 --profile-hooks
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

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
    parser.add_argument("--profile-hooks", action="store_true",
                        help="one more run per case with the watchdog's hooks under cProfile (where their time goes)")
    parser.add_argument("--sample-interval", type=float, default=0.1,
                        help="the watchdog's NVML polling interval, s (its default 0.1): whether its thread's polls "
                        "cost the training process time")  # fmt: skip
    parser.add_argument("--out", default=str(RESULTS), help="where the JSON and Markdown results go")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workloads"))
    from tokens_lm import GPT

    tokens = torch.randint(0, 8192, (8, 129), device="cuda")
    batch = (torch.randint(0, 256, (256, 3, 224, 224), dtype=torch.uint8, device="cuda"),
             torch.randint(0, 100, (256,), device="cuda"))  # fmt: skip

    def timed_hooks(dog: GPUUtilWatchdog, profiler: Any = None) -> list[float]:
        """Time every step hook of ``dog`` (Lightning calls them through the instance's attributes): the list holds
        the total, then each step's two hooks together (one-off costs stand out from the per-step ones);
        ``profiler``: a ``cProfile.Profile`` that runs inside the hooks only."""
        spent = [0.0]
        for name in ("on_train_batch_start", "on_train_batch_end"):  # its hooks inside the step loop
            hook, end = getattr(dog, name), name.endswith("end")

            def timed(*a, _hook=hook, _end=end, **k):
                start = time.perf_counter()
                if profiler is not None:
                    profiler.enable()
                try:
                    return _hook(*a, **k)
                finally:
                    if profiler is not None:
                        profiler.disable()
                    took = time.perf_counter() - start
                    spent[0] += took
                    if _end:
                        spent[-1] += took
                    else:
                        spent.append(took)

            setattr(dog, name, timed)
        return spent

    def run(case: str, watchdog: bool, profiler: Any = None) -> dict:
        torch.manual_seed(0)
        callbacks: tuple = (GPUUtilWatchdog(on_starvation="ignore", summary=False,
                                                        sample_interval_s=args.sample_interval),) if watchdog else ()
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
        spent = timed_hooks(callbacks[0], profiler) if watchdog else None
        out = _fit(model, data, "bf16-mixed", steps, 8, callbacks)
        if watchdog:
            dog = callbacks[0]
            out["hooks_ms_per_step"] = 1000 * spent[0] / max(1, model.trainer.global_step)
            per_step = sorted(1000 * t for t in spent[1:])
            if per_step:  # the typical step's hooks, and the one-off costs (the slowest steps' hooks)
                out["hooks_ms_median_step"] = statistics.median(per_step)
                out["hooks_ms_slowest_steps"] = [round(t, 3) for t in per_step[-5:]]
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
                          "hooks_ms_median_step": on.get("hooks_ms_median_step"),
                          "hooks_ms_slowest_steps": on.get("hooks_ms_slowest_steps"),
                          "hooks_frac_of_step": on["hooks_ms_per_step"] / off["step_ms"]})  # fmt: skip
        figures[case] = {"pairs": pairs, "median_ratio": statistics.median(p["ratio"] for p in pairs),
                         "median_hooks_frac_of_step": statistics.median(p["hooks_frac_of_step"] for p in pairs)}
        typical = [p["hooks_ms_median_step"] / p["step_ms_off"] for p in pairs if p["hooks_ms_median_step"]]
        if typical:  # a typical step's share, one-off costs (the first window's verdict, warm-up) left out
            figures[case]["median_hooks_typical_step_frac"] = statistics.median(typical)
        if args.profile_hooks:  # one more run with the hooks under cProfile: where their time goes
            import cProfile
            import io
            import pstats

            profiler = cProfile.Profile()
            run(case, True, profiler)
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
            figures[case]["hooks_profile"] = [line for line in text.getvalue().splitlines() if line.strip()][:45]
        if case == "transformer":
            bars["transformer_watchdog_hooks_frac_of_step"] = bar(figures[case]["median_hooks_frac_of_step"], 0.005,
                                                                  "share of the step", higher_is_better=False)  # fmt: skip
        else:
            target = 0.99 if case == "loader" else 0.995
            bars[f"{case}_with_watchdog_vs_without"] = bar(figures[case]["median_ratio"], target, "x")
    print(write_result("watchdog_overhead", figures, bars, args.out))


if __name__ == "__main__":
    main()
