"""Diagnosis: `doctor`'s short trial fits of a workload at worker counts, timed as ``diagnose`` times them: over the
loader's own whole epochs where an epoch is short (``short_epochs``), else a window of steps (an endless clone); at
another count than the project's, the loader as ``AutoNumWorkers()`` applies it (workers kept between epochs), or
with ``--hand-set`` as a user setting ``num_workers=N`` alone (persistence as the project has it).

Why: until 8f57ac1, ``diagnose`` asked the endless clone whether its epochs were short (it has none), so every trial
was timed in a window and left each epoch's start out: `photos_hr` on the H200 at 10ae4b6 read 23.7 -> 84.6
samples/s (3.58x) where the applied ``AutoNumWorkers()`` run measured 2.45x (64.8 samples/s; diagnosis-2026-11-27-h200,
error 0.31). At 8f57ac1 (``--hand-set``: 16 workers started again every 24-batch epoch) this script read 53.3
samples/s over whole epochs: the applied run keeps its 16 workers (AutoNumWorkers' ``persistent_workers=True``), so
the trial at the advised count now runs them so too.

For the workload named, at each ``--counts`` (in that order; the result is written after each fit):
``samples_per_s``, how it was timed, the epochs timed and their halves; then the gain from the first count to each
other one, and where ``--measured-gain`` is given (the applied run's, from a diagnosis file), the error of the gain
from the last count (the project's) to the first.

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
from lightning_gpu_boost.doctor import trial_fit

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
_spec = importlib.util.spec_from_file_location("workloads_runner", WORKLOADS / "__main__.py")
RUNNER = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(RUNNER)  # type: ignore[union-attr]  # puts benchmarks/workloads on sys.path


def fit_at(name: str, size: str, root: Path, count: int, steps: int, persistent: bool = True) -> dict[str, Any]:
    """One trial fit of ``name``'s model with its loader at ``count`` workers, as ``diagnose`` runs it (another count
    than the project's as AutoNumWorkers() applies it; ``persistent=False``: as set by hand, persistence kept)."""
    module = importlib.import_module(name)
    model, loader, _, kwargs = module.build(module.prepare(root, size), size)
    gpu = size == "gpu" and torch.cuda.is_available()
    trainer = {"accelerator": "gpu" if gpu else "cpu", **{k: v for k, v in kwargs.items() if k == "precision"}}
    started = time.perf_counter()
    fit = trial_fit(model, loader, count, steps, persistent_workers=None if persistent else loader.persistent_workers,
                    **trainer)  # fmt: skip
    row = {"samples_per_s": fit["samples_per_s"], "as_auto_num_workers": persistent, "timed": fit["measured"],
           "epochs_timed": fit.get("epochs_timed"), "halves_diff": fit.get("halves_diff"),
           "batches_per_epoch": len(loader), "seconds": time.perf_counter() - started}  # fmt: skip
    del model, loader
    gc.collect()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="photos_hr", help="the workload (benchmarks/workloads)")
    parser.add_argument("--size", choices=["cpu", "gpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--counts", nargs="+", type=int, default=[16, 4], help="worker counts, in this order")
    parser.add_argument("--steps", type=int, default=32, help="the fit's steps (diagnose's: max(2 * steps, 32))")
    parser.add_argument("--measured-gain", type=float, help="the applied run's gain to compare with (a diagnosis file's)")
    parser.add_argument("--hand-set", action="store_true", help="another count as set by hand (num_workers alone), "
                        "not as AutoNumWorkers() applies it")  # fmt: skip
    parser.add_argument("--data", default="/tmp/wl", help="where the workloads write their data")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    fits: dict[int, dict[str, Any]] = {}
    figures: dict[str, Any] = {"config": vars(args), "fits": fits}
    for count in args.counts:
        fits[count] = fit_at(args.only, args.size, Path(args.data), count, args.steps, not args.hand_set)
        print(f"{args.only}: num_workers={count}: {fits[count]}", flush=True)
        base = fits[args.counts[0]]["samples_per_s"]
        figures["gains_from_first"] = {c: f["samples_per_s"] / base for c, f in fits.items()}
        if args.measured_gain and len(fits) > 1:
            first, last = args.counts[0], args.counts[-1]
            # the prediction is from the project's count (the last one here) to the advised one (the first)
            predicted = fits[first]["samples_per_s"] / fits[last]["samples_per_s"]
            figures["predicted_gain"], figures["measured_gain"] = predicted, args.measured_gain
            figures["prediction_error"] = abs(args.measured_gain / predicted - 1)  # diagnosis.py's bar: <= 0.25
        print(f"wrote {write_result('doctor_fits', figures, {}, args.out)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
