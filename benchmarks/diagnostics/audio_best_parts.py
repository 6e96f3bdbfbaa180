"""Diagnosis: where the ``audio`` workload's documented best loses to its ceiling (the step on one resident batch),
by taking the best's parts away one at a time, each case run through the workloads runner (``fit``), in turn:

- ``ceiling``: the runner's ceiling (the plain loader's first batch, features made in its workers, resident);
- ``varying_features``: 16 of the best's batches, their features made once on the GPU (``LogMel(pad_to=64)``),
  resident and cycled: the ceiling plus the best's batch shapes;
- ``resident_waves``: the same 16 batches as waveforms in pinned memory, cycled through ``GPUBoost(transform=
  LogMel(...))``: copy, features and shapes per step, but no worker processes or pin-memory thread;
- ``best``: the documented best (4 workers reading the waveforms, the transform on the GPU).

    cd benchmarks/diagnostics && python audio_best_parts.py --data /tmp/wl --rounds 2
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import statistics
import sys
from pathlib import Path

import torch

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"
sys.path.insert(0, str(WORKLOADS))

import _best  # noqa: E402

from lightning_gpu_boost.callbacks import GPUBoost  # noqa: E402
from lightning_gpu_boost.core.results import write_result  # noqa: E402

CASES = ("ceiling", "varying_features", "resident_waves", "best")


class Cycle:
    """``batches`` over and over, ``length`` per epoch."""

    def __init__(self, batches: list, length: int) -> None:
        self.batches, self.length = batches, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return itertools.islice(itertools.cycle(self.batches), self.length)


def _parts(data: Path, size: str, features: bool):
    model, loader, val, kwargs, callbacks = _best.audio(data, size)
    mel = callbacks[0].parts["prefetch"].transform
    batches = list(itertools.islice(iter(loader), 16))
    del loader
    if features:
        device = torch.device("cuda")
        made = [mel(tuple(t.to(device) for t in b)) for b in batches]
        return model, Cycle(made, 10_000), val, kwargs, [GPUBoost(prefetch=False, auto_workers=False, watchdog=False)]
    return model, Cycle(batches, 10_000), val, kwargs, [GPUBoost(transform=mel, auto_workers=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/tmp/wl")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("workloads_main", WORKLOADS / "__main__.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    best = _best.BEST["audio"]
    rates: dict[str, list[float]] = {c: [] for c in CASES}
    steps: dict[str, list[float]] = {c: [] for c in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            if case == "ceiling":
                r = runner.fit("audio", "gpu", Path(args.data), "ceiling")
            else:
                if case == "best":
                    _best.BEST["audio"] = best
                else:
                    _best.BEST["audio"] = lambda d, s, f=case == "varying_features": _parts(d, s, f)
                r = runner.fit("audio", "gpu", Path(args.data), "best")
            rates[case].append(r["throughput"]["samples_per_s"])
            steps[case].append(r["watchdog"].get("step_ms", float("nan")))
            print(f"{case}: {rates[case][-1]:,.0f} samples/s, step {steps[case][-1]:.1f} ms", flush=True)
    _best.BEST["audio"] = best
    figures = {"config": vars(args), "samples_per_s": rates, "step_ms": steps,
               "median_of_ceiling": {c: statistics.median(rates[c]) / statistics.median(rates["ceiling"])
                                     for c in CASES}}  # fmt: skip
    print(figures["median_of_ceiling"])
    print(f"wrote {write_result('audio_best_parts', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
