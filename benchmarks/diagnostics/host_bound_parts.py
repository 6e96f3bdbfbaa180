"""Diagnosis: which part of ``GPUBoost()`` slows the host-bound workload (``benchmarks/workloads/host_bound.py``).

    cd benchmarks/diagnostics && python host_bound_parts.py --out /tmp

The workload's model and loader at GPU size (a step that syncs twice and runs tens of milliseconds of Python), one
fit per variant, ``--rounds`` interleaved rounds, ThroughputMeter after the loader's queue drained:

- ``plain``: the workload as written (0 workers, the tensor-batch idiom);
- ``gpu_boost``: ``GPUBoost()``; ``gpu_boost_no_tuner``: ``GPUBoost(auto_workers=False)``;
- ``prefetch``: ``StreamPrefetch()`` alone;
- ``workers_N``: the same loader with N persistent, pinned workers (what the tuner may choose), no callback.
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

import host_bound as hb  # noqa: E402
import lightning.pytorch as pl  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from lightning_gpu_boost.callbacks import GPUBoost, StreamPrefetch  # noqa: E402
from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter  # noqa: E402
from lightning_gpu_boost.core.results import environment  # noqa: E402


def fit(variant: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model, loader, _, _ = hb.build(Path("."), "gpu")
    callbacks: list[Any] = []
    if variant == "gpu_boost":
        callbacks.append(GPUBoost())
    elif variant == "gpu_boost_no_tuner":
        callbacks.append(GPUBoost(auto_workers=False))
    elif variant == "prefetch":
        callbacks.append(StreamPrefetch())
    elif variant.startswith("workers_"):
        n = int(variant.split("_")[1])
        loader = DataLoader(loader.dataset, sampler=loader.sampler, batch_size=None, num_workers=n,
                            persistent_workers=True, pin_memory=True, prefetch_factor=2)  # fmt: skip
    meter = ThroughputMeter(warmup=40, steps=100, sample_gpu_util=False)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=150, max_epochs=-1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, callbacks=[meter, *callbacks])  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, loader)
    s = meter.summary()
    workers = getattr(trainer.train_dataloader, "num_workers", None)
    return {"samples_per_s": s["samples_per_s"], "halves_diff": s["halves_diff"], "num_workers": workers,
            "process_cpu_cores": s.get("process_cpu_cores")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+",
                        default=["plain", "gpu_boost", "gpu_boost_no_tuner", "prefetch", "workers_2", "workers_16"])
    parser.add_argument("--out", default=".", help="folder for host_bound_parts.json")
    args = parser.parse_args()
    runs: dict[str, list] = {v: [] for v in args.variants}
    for _ in range(args.rounds):
        for v in args.variants:
            runs[v].append(fit(v))
            print(v, runs[v][-1], flush=True)
    med = {v: float(np.median([r["samples_per_s"] for r in rs])) for v, rs in runs.items()}
    result = {"environment": environment(), "runs": runs, "median_samples_per_s": med,
              "of_plain": {v: m / med["plain"] for v, m in med.items()} if "plain" in med else {}}
    print(json.dumps({k: result[k] for k in ("median_samples_per_s", "of_plain")}, indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "host_bound_parts.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
