"""Diagnosis: does a batch transform on the side stream hide better behind a GPU-saturating step when the step's
stream has the higher priority? The ``segmentation`` workload's U-Net step (batch 16, 512 px, its own resident
batch) with ``JointAugment`` (rotation, elastic warp, colour, per sample) run on a side stream one batch ahead, as
``StreamPrefetcher`` runs it, in a plain torch loop:

- ``alone``: the step alone, on the given stream;
- ``staged``: the step plus the stage on the side stream (priority 0: CUDA's lowest, also the default stream's).

The step runs on the default stream (``default``) or on a stream of the highest priority (``high``). The figure of
issue 18's bar: ``(staged - alone) / stage``, ``stage`` the transform's own time (synchronized, alone).

    python benchmarks/diagnostics/stage_priority.py --data /tmp/wl
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks" / "workloads"), str(ROOT)]

from _best import RawPairs  # noqa: E402

from lightning_gpu_boost.core.gpu_transforms import JointAugment  # noqa: E402
from lightning_gpu_boost.core.results import write_result  # noqa: E402


def run(model, opt, raw, aug, step_stream, staged: bool, steps: int) -> float:
    """Milliseconds per step over ``steps`` steps after 10 (the stage one batch ahead where ``staged``)."""
    side = torch.cuda.Stream()
    fixed = aug(raw)
    torch.cuda.synchronize()

    def stage():
        side.wait_stream(step_stream)
        with torch.cuda.stream(side):
            out = aug(raw)
            done = torch.cuda.Event()
            done.record(side)
        return out, done

    with torch.cuda.stream(step_stream):
        ahead = stage() if staged else None
        for k in range(10 + steps):
            if k == 10:
                torch.cuda.synchronize()
                started = time.perf_counter()
            if staged:
                (image, mask), done = ahead
                step_stream.wait_event(done)
                ahead = stage()
            else:
                image, mask = fixed
            loss = F.cross_entropy(model(image), mask)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - started) / steps


def main() -> None:
    import segmentation as seg

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="/tmp/wl")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("high")
    cfg = seg.SIZES["gpu"]
    pairs = RawPairs(seg.prepare(Path(args.data), "gpu"))
    raw = [torch.stack(t).cuda() for t in zip(*(pairs[i] for i in range(cfg["batch"])), strict=True)]
    aug = JointAugment(size=cfg["crop"], degrees=30.0, elastic=0.05, jitter=0.3, ignore_index=0)
    model = seg.UNet(cfg["classes"], cfg["width"]).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    streams = {"default": torch.cuda.default_stream(), "high": torch.cuda.Stream(priority=-1)}  # torch: < 0 is higher
    for _ in range(3):
        aug(raw)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(20):
        aug(raw)
    torch.cuda.synchronize()
    stage = 1000 * (time.perf_counter() - started) / 20
    ms: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, stream in streams.items():
            for staged in (False, True):
                key = f"{name}_{'staged' if staged else 'alone'}"
                ms.setdefault(key, []).append(run(model, opt, raw, aug, stream, staged, args.steps))
                print(key, f"{ms[key][-1]:.2f} ms", flush=True)
    med = {k: statistics.median(v) for k, v in ms.items()}
    figures = {"config": vars(args), "priorities": {k: v.priority for k, v in streams.items()}, "stage_ms": stage, "ms_per_step": ms,
               "median_ms": med,
               "extra_of_stage": {name: (med[f"{name}_staged"] - med[f"{name}_alone"]) / stage for name in streams}}  # fmt: skip
    print(figures["extra_of_stage"], f"stage {stage:.2f} ms")
    print(f"wrote {write_result('stage_priority', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
