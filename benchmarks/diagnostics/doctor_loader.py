"""Diagnosis: where `doctor`'s loader-alone figure and what the loader delivers in a fit part (issue 41: within
10 %). On the H200 (diagnosis-2026-11-27-h200) `segmentation`'s loader alone read 6.7 samples/s at its 4 workers
where its data-bound plain fits delivered 9.1-10.2; `audio`, `speech_ctc` and `vit_finetune` were within 4-8 %.

For each workload named, one after another in this process:

- ``probe``: the worker search's figure at the project's count (what `doctor` reports: its steady-state table,
  at the probe's batch size, ``probe_batch_size``, scaled to the loader's), and that window's figures;
- ``alone_own_batch``: the loader alone at the project's count and its own batch size, one long window
  (``--window`` seconds at least, the queue skipped);
- ``fit``: the plain project's fit (the workloads' runner, steady state), samples/s and its data wait.

    cd benchmarks/diagnostics && python doctor_loader.py --only segmentation audio --data /tmp/wl
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _common import RESULTS

from lightning_gpu_boost.core.loader_rate import _sample_seconds, clone_loader, measure_loader, sample_seconds
from lightning_gpu_boost.core.results import write_result
from lightning_gpu_boost.core.workers import tune_num_workers

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
_spec = importlib.util.spec_from_file_location("workloads_runner", WORKLOADS / "__main__.py")
RUNNER = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(RUNNER)  # type: ignore[union-attr]  # puts benchmarks/workloads on sys.path


def one(name: str, size: str, root: Path, budget_s: float, window_s: float) -> dict[str, Any]:
    module = importlib.import_module(name)
    data = module.prepare(root, size)
    _, loader, _, _ = module.build(data, size)
    batch, workers = loader.batch_size or 1, loader.num_workers
    row: dict[str, Any] = {"batch_size": batch, "num_workers": workers}
    # one sample's cost as the search takes it (one torch thread, as a worker runs) and on all of this process's
    # threads (how it was taken before 45dde12)
    row["sample_ms"] = {"one_thread": 1000 * (sample_seconds(loader) or 0.0)}
    threads = torch.get_num_threads()
    row["sample_ms"]["all_threads"] = 1000 * (_sample_seconds(loader, loader.dataset, 1.0) or 0.0)
    row["sample_ms"]["threads"] = threads
    started = time.perf_counter()
    probe = tune_num_workers(loader, budget_s=budget_s)
    row["probe"] = {"seconds": time.perf_counter() - started, "probe_batch_size": probe.probe_batch_size,
                    "sample_ms": probe.sample_ms, "chosen": probe.num_workers,
                    "samples_per_s_by_workers": {w: r * batch for w, r in probe.table.items()},
                    "window_at_project_count": probe.windows.get(workers)}  # fmt: skip
    window = measure_loader(clone_loader(loader, workers), workers, cap_s=4 * window_s, min_window_s=window_s)
    row["alone_own_batch"] = {"samples_per_s": window.rate * batch, **window.as_dict()}
    fit = RUNNER.fit(name, size, root)
    row["fit"] = {"samples_per_s": fit["throughput"]["samples_per_s"], "verdict": fit["verdict"],
                  "data_wait_frac": fit["throughput"].get("data_wait_frac"),
                  "halves_diff": fit["throughput"].get("halves_diff")}  # fmt: skip
    at = row["probe"]["samples_per_s_by_workers"].get(workers)
    row["probe_vs_fit"] = at / row["fit"]["samples_per_s"] if at else None
    row["alone_vs_fit"] = row["alone_own_batch"]["samples_per_s"] / row["fit"]["samples_per_s"]
    print(f"{name}: probe {at} alone {row['alone_own_batch']['samples_per_s']:.2f} fit "
          f"{row['fit']['samples_per_s']:.2f} samples/s (probe batch {probe.probe_batch_size})", flush=True)
    return row


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", default=["segmentation"], help="workloads (benchmarks/workloads)")
    parser.add_argument("--size", choices=["cpu", "gpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data", default="/tmp/wl", help="where the workloads write their data")
    parser.add_argument("--budget", type=float, default=30.0, help="the worker search's budget (doctor's on a GPU)")
    parser.add_argument("--window", type=float, default=20.0, help="the long window's least seconds")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    rows = {}
    for name in args.only:
        rows[name] = one(name, args.size, Path(args.data), args.budget, args.window)
        print(f"wrote {write_result('doctor_loader', {'config': vars(args), 'workloads': rows}, {}, args.out)}")


if __name__ == "__main__":
    sys.exit(main())
