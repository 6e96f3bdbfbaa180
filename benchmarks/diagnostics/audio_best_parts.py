"""Diagnosis: where the ``audio`` workload's documented best loses to its ceiling (the step on one resident batch),
by taking the best's parts away one at a time, each case run through the workloads runner (``fit``), in turn:

- ``ceiling``: the runner's ceiling (the plain loader's first batch, features made in its workers, resident);
- ``varying_features``: 16 of the best's batches, their features made once on the GPU (``LogMel(pad_to=64)``),
  resident and cycled: the ceiling plus the best's batch shapes;
- ``resident_waves``: the same 16 batches as waveforms in pinned memory, cycled through ``GPUBoost(transform=
  LogMel(...))``: copy, features and shapes per step, but no worker processes or pin-memory thread;
- ``best``: the documented best (4 workers reading the waveforms, the transform on the GPU);
- ``best_8_workers``: the same with 8 workers;
- ``best_16k``: the workers also resample to 16 kHz (the same linear interpolation as ``LogMel``'s, back to int16):
  2.75x fewer bytes per batch through shared memory, pinning and the copy.

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

CASES = ("ceiling", "varying_features", "resident_waves", "best", "best_8_workers", "best_16k")


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


class Resampled(torch.utils.data.Dataset):
    """A clip dataset's int16 waveforms resampled in the worker (``LogMel``'s interpolation), still int16."""

    def __init__(self, dataset, source_rate: int, rate: int) -> None:
        self.dataset, self.scale = dataset, rate / source_rate

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        wave, label = self.dataset[i]
        x = torch.nn.functional.interpolate(wave.float()[None, None], scale_factor=self.scale, mode="linear",
                                            align_corners=False, recompute_scale_factor=False)[0, 0]  # fmt: skip
        return x.round().clamp(-32768, 32767).to(torch.int16), label


def _variant(data: Path, size: str, case: str):
    import audio as w

    from lightning_gpu_boost.core.gpu_transforms import LogMel

    model, loader, val, kwargs, callbacks = _best.audio(data, size)
    dataset, rate = loader.dataset, w.SOURCE_RATE
    if case == "best_16k":
        dataset, rate = Resampled(dataset, w.SOURCE_RATE, w.RATE), w.RATE
    workers = 8 if case == "best_8_workers" else loader.num_workers
    mel = LogMel(source_rate=rate, rate=w.RATE, n_fft=w.N_FFT, hop=w.HOP, n_mels=w.MELS, pad_to=64)
    loader = torch.utils.data.DataLoader(dataset, batch_size=loader.batch_size, shuffle=True, num_workers=workers,
                                         pin_memory=True, collate_fn=loader.collate_fn, drop_last=True,
                                         persistent_workers=True)  # fmt: skip
    return model, loader, val, kwargs, [GPUBoost(transform=mel, auto_workers=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/tmp/wl")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--out", default=None, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("workloads_main", WORKLOADS / "__main__.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    best = _best.BEST["audio"]
    cases = args.cases if "ceiling" in args.cases else ["ceiling", *args.cases]
    rates: dict[str, list[float]] = {c: [] for c in cases}
    steps: dict[str, list[float]] = {c: [] for c in cases}
    for _ in range(args.rounds):
        for case in cases:
            if case == "ceiling":
                r = runner.fit("audio", "gpu", Path(args.data), "ceiling")
            else:
                if case == "best":
                    _best.BEST["audio"] = best
                elif case.startswith("best_"):
                    _best.BEST["audio"] = lambda d, s, c=case: _variant(d, s, c)
                else:
                    _best.BEST["audio"] = lambda d, s, f=case == "varying_features": _parts(d, s, f)
                r = runner.fit("audio", "gpu", Path(args.data), "best")
            rates[case].append(r["throughput"]["samples_per_s"])
            steps[case].append(r["watchdog"].get("step_ms", float("nan")))
            print(f"{case}: {rates[case][-1]:,.0f} samples/s, step {steps[case][-1]:.1f} ms", flush=True)
    _best.BEST["audio"] = best
    figures = {"config": vars(args), "samples_per_s": rates, "step_ms": steps,
               "median_of_ceiling": {c: statistics.median(rates[c]) / statistics.median(rates["ceiling"])
                                     for c in cases}}  # fmt: skip
    print(figures["median_of_ceiling"])
    print(f"wrote {write_result('audio_best_parts', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
