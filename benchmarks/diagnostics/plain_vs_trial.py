"""Diagnosis: a workload's plain run (``benchmarks/workloads``' runner, as ``diagnosis.py`` times it) against
``doctor``'s trial fit at the project's own worker count (``trial_fit``, as ``diagnose`` runs it), side by side in
alternating rounds on one machine; and the plain run without the watchdog, to tell its cost apart.

Why: issue 41 asks the doctor's figure taken in the conditions of training to match what the loader delivers in a
fit within 10 %. ``photos_hr`` on the H200 at c98c907 (diagnosis-2026-11-27-h200): the trial at 4 workers read 28.5
samples/s over whole epochs where the plain runs read 21.8-23.4 (+24 %); a session before, in a window, 23.7 against
24.6-26.7. Each round runs every variant once, in the order given, and the result is written after each fit
(``--rows-from``: an earlier call's rows come first, on a machine lent one call at a time).

    cd benchmarks/diagnostics && python plain_vs_trial.py --only photos_hr --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from _common import RESULTS
from doctor_fits import RUNNER, fit_at

from lightning_gpu_boost.core.results import write_result

VARIANTS = ("plain", "plain_no_watchdog", "trial", "trial_long")


class NoWatchdog(pl.Callback):
    """Stands in for the runner's GPUUtilWatchdog: no hooks; the read-outs the runner takes, empty."""

    def __init__(self, **_: Any) -> None:
        super().__init__()

    run_verdict = None
    run_advice: list[str] = []
    warnings: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []


def _plain(name: str, size: str, root: Path, watchdog: bool) -> dict[str, Any]:
    real = RUNNER.GPUUtilWatchdog
    if not watchdog:
        RUNNER.GPUUtilWatchdog = NoWatchdog
    try:
        started = time.perf_counter()
        run = RUNNER.fit(name, size, root, "plain")
    finally:
        RUNNER.GPUUtilWatchdog = real
    t = run["throughput"]
    return {"samples_per_s": t["samples_per_s"], "timed": t.get("measured"), "epochs_timed": t.get("epochs_timed"),
            "halves_diff": t.get("halves_diff"), "verdict": run["verdict"],
            "seconds": time.perf_counter() - started}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="photos_hr", help="the workload (benchmarks/workloads)")
    parser.add_argument("--size", choices=["cpu", "gpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS[:3]))
    parser.add_argument("--steps", type=int, default=32, help="the trial's steps (diagnose's on a GPU: 32); "
                        "trial_long: three times as many")  # fmt: skip
    parser.add_argument("--rows-from", help="this script's earlier result (a call cut short): its rows come first")
    parser.add_argument("--data", default="/tmp/wl", help="where the workloads write their data")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    module = RUNNER.importlib.import_module(args.only)
    count = module.build(module.prepare(Path(args.data), args.size), args.size)[1].num_workers
    rows: list[dict[str, Any]] = []
    if args.rows_from:
        rows += json.loads(Path(args.rows_from).read_text())["figures"]["rows"]
    first = 1 + max((row["round"] for row in rows), default=-1)
    figures: dict[str, Any] = {"config": vars(args), "num_workers": count, "rows": rows}
    for r in range(first, first + args.rounds):
        for variant in args.variants:
            if variant.startswith("plain"):
                row = _plain(args.only, args.size, Path(args.data), watchdog=variant == "plain")
            else:
                steps = args.steps * (3 if variant == "trial_long" else 1)
                row = fit_at(args.only, args.size, Path(args.data), count, steps, persistent=False)
            rows.append({"round": r, "variant": variant, **row})
            print(f"{args.only} round {r} {variant}: {row}", flush=True)
            by = {v: [x["samples_per_s"] for x in rows if x["variant"] == v] for v in VARIANTS}
            figures["median_samples_per_s"] = {v: statistics.median(x) for v, x in by.items() if x}
            med = figures["median_samples_per_s"]
            if "plain" in med:
                figures["vs_plain"] = {v: m / med["plain"] for v, m in med.items()}
            write_result(f"plain_vs_trial-{args.only}", figures, {}, args.out)
    print(f"medians: {figures['median_samples_per_s']}; vs plain: {figures.get('vs_plain')}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
