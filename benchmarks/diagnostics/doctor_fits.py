"""Diagnosis: `doctor`'s short trial fits of a workload at worker counts, timed as ``diagnose`` times them now: over
the loader's own whole epochs where it starts its workers again every short epoch (a finite clone), else a window of
steps (an endless clone). Until the fix beside this script, ``diagnose`` checked the endless clone for short epochs
(it has none), so such fits were timed in a window and left every epoch's start out: `photos_hr` on the H200 at
10ae4b6 read 23.7 -> 84.6 samples/s (3.58x) where the applied `AutoNumWorkers()` run measured 2.45x
(diagnosis-2026-11-27-h200, error 0.31).

For the workload named, at each ``--counts`` (in that order; the result is written after each fit):
``samples_per_s``, how it was timed, the epochs timed and their halves; then the gain from the first count to each
other one, beside ``--measured-gain`` (the applied run's, from a diagnosis file) where given.

    cd benchmarks/diagnostics && python doctor_fits.py --only photos_hr --counts 16 4 --measured-gain 2.454
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _common import RESULTS

from lightning_gpu_boost.core.results import write_result
from lightning_gpu_boost.core.workers import clone_loader
from lightning_gpu_boost.doctor import measure_epochs_fit, measure_fit, restarts_short_epochs

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
_spec = importlib.util.spec_from_file_location("workloads_runner", WORKLOADS / "__main__.py")
RUNNER = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(RUNNER)  # type: ignore[union-attr]  # puts benchmarks/workloads on sys.path


def fit_at(name: str, size: str, root: Path, count: int, steps: int) -> dict[str, Any]:
    """One trial fit of ``name``'s model with its loader at ``count`` workers, as ``diagnose`` runs it."""
    module = importlib.import_module(name)
    model, loader, _, kwargs = module.build(module.prepare(root, size), size)
    gpu = size == "gpu" and torch.cuda.is_available()
    trainer = {"accelerator": "gpu" if gpu else "cpu", **{k: v for k, v in kwargs.items() if k == "precision"}}
    started = time.perf_counter()
    epochs = clone_loader(loader, count, loader.prefetch_factor or 2, endless=False)
    if restarts_short_epochs(epochs, steps):
        fit = measure_epochs_fit(model, epochs, steps=steps, **trainer)
    else:
        fit = measure_fit(model, clone_loader(loader, count), steps=steps, warmup=3, **trainer)
        fit["measured"] = "steps"
    row = {"samples_per_s": fit["samples_per_s"], "timed": fit.get("measured"), "epochs_timed": fit.get("epochs_timed"),
           "halves_diff": fit.get("halves_diff"), "batches_per_epoch": len(loader), "seconds": time.perf_counter() - started}  # fmt: skip
    del model, loader, epochs
    gc.collect()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="photos_hr", help="the workload (benchmarks/workloads)")
    parser.add_argument("--size", choices=["cpu", "gpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--counts", nargs="+", type=int, default=[16, 4], help="worker counts, in this order")
    parser.add_argument("--steps", type=int, default=32, help="the fit's steps (diagnose's: max(2 * steps, 32))")
    parser.add_argument("--measured-gain", type=float, help="the applied run's gain to compare with (a diagnosis file's)")
    parser.add_argument("--data", default="/tmp/wl", help="where the workloads write their data")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    fits: dict[int, dict[str, Any]] = {}
    figures: dict[str, Any] = {"config": vars(args), "fits": fits}
    for count in args.counts:
        fits[count] = fit_at(args.only, args.size, Path(args.data), count, args.steps)
        print(f"{args.only}: num_workers={count}: {fits[count]}", flush=True)
        base = fits[args.counts[0]]["samples_per_s"]
        figures["gains_from_first"] = {c: f["samples_per_s"] / base for c, f in fits.items()}
        bars = {}
        if args.measured_gain and len(fits) > 1:
            first, last = args.counts[0], args.counts[-1]
            # the prediction is from the project's count (the last one here) to the advised one (the first)
            predicted = fits[first]["samples_per_s"] / fits[last]["samples_per_s"]
            figures["predicted_gain"], figures["measured_gain"] = predicted, args.measured_gain
            error = abs(args.measured_gain / predicted - 1)
            bars["prediction_error"] = {"value": round(error, 4), "target": 0.25,
                                        "unit": "abs(measured/predicted - 1)", "pass": error <= 0.25}  # fmt: skip
        print(f"wrote {write_result('doctor_fits', figures, bars, args.out)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
