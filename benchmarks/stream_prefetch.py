"""StreamPrefetch in a real Trainer on a transfer-bound step, side by side with plain Lightning, copy alone and
compute alone; the uint8 + GPU-normalize path; and a compute-bound ResNet-50 (no slowdown allowed).

    python benchmarks/stream_prefetch.py                 # H100 defaults (needs a CUDA GPU)
    python benchmarks/stream_prefetch.py --steps 20 --batch-size 64 --out /tmp

Bars (issue 3):
- transfer-bound step with StreamPrefetch <= 1.05 x max(copy alone, compute alone), and >= 1.2x faster than plain;
- uint8 moves 4x fewer bytes than float32 and its step is no slower than the float32 prefetch path;
- compute-bound ResNet-50: StreamPrefetch step time <= 1.01 x plain Lightning's.
"""

from __future__ import annotations

import argparse
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_gpu_boost.callbacks import StreamPrefetch
from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
from lightning_gpu_boost.core.images import IMAGENET_MEAN, IMAGENET_STD
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.core.steady import worst_halves_diff
from lightning_gpu_boost.models import ImageClassifier


class Batches(Dataset):
    """``length`` items cycling over a few pre-made batches (pinned, or already on the GPU); no copy on access."""

    def __init__(self, batches: list, length: int) -> None:
        self.batches, self.length = batches, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        return self.batches[i % len(self.batches)]


def make_batches(n: int, batch_size: int, size: int, dtype: torch.dtype, device: str = "cpu") -> list:
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        if dtype == torch.uint8:
            x = torch.randint(0, 256, (batch_size, 3, size, size), dtype=torch.uint8, generator=g)
        else:
            x = torch.randn(batch_size, 3, size, size, generator=g, dtype=dtype)
        y = torch.randint(0, 100, (batch_size,), generator=g)
        x, y = (x.pin_memory(), y.pin_memory()) if device == "cpu" else (x.to(device), y.to(device))
        out.append((x, y))
    return out


def copy_ms(batch: tuple, repeats: int = 20) -> float:
    x = batch[0]
    x.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        x.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start) / repeats


#: every timed window of the run (ThroughputMeter summaries: queue, warm-up, timed steps, halves)
WINDOWS: dict[str, list[dict]] = {}


def step_ms(model: pl.LightningModule, batches: list, steps: int, warmup: int, callbacks=(), name: str = "") -> float:
    """Mean step time over the steady window (the loader has no workers: no queue; the rule of core/steady.py
    still skips 4 steps at least and moves the window later where its halves differ by more than 5 %)."""
    meter = ThroughputMeter(warmup=warmup, sample_gpu_util=False)
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=warmup + steps,
        callbacks=[meter, *callbacks], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(model, DataLoader(Batches(batches, warmup + steps), batch_size=None))
    summary = meter.summary()
    WINDOWS.setdefault(name, []).append(summary)
    if not summary.get("steady", True):
        print(f"  {name}: not steady (halves {100 * summary['halves_diff']:.0f} % apart)")
    return summary["step_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument(
        "--width",
        type=int,
        default=16,
        help="channels of the light two-conv model (compute ~ the anchor's 10 ms)",
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--resnet-steps", type=int, default=40)
    parser.add_argument(
        "--repeats", type=int, default=2, help="interleaved repeats of every case (best counts)"
    )
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/stream_prefetch.py needs a CUDA GPU.")
    torch.backends.cudnn.benchmark = True
    bs, size, steps, warmup = args.batch_size, args.image_size, args.steps, args.warmup
    norm = (IMAGENET_MEAN, IMAGENET_STD)

    def light() -> ImageClassifier:
        torch.manual_seed(0)
        return ImageClassifier("two_conv", num_classes=100, width=args.width, channels_last=True)

    float_pinned = make_batches(3, bs, size, torch.float32)
    uint8_pinned = make_batches(3, bs, size, torch.uint8)
    resident = [(x.to("cuda"), y.to("cuda")) for x, y in float_pinned[:1]]
    f = {
        "float32_batch_mb": float_pinned[0][0].nbytes / 1e6,
        "uint8_batch_mb": uint8_pinned[0][0].nbytes / 1e6,
        "copy_alone_ms": copy_ms(float_pinned[0]),
        "uint8_copy_alone_ms": copy_ms(uint8_pinned[0]),
    }
    cases = {
        "compute_alone_ms": (resident, []),
        "plain_lightning_ms": (float_pinned, []),
        "stream_prefetch_ms": (float_pinned, [StreamPrefetch]),
        "uint8_gpu_normalize_ms": (
            uint8_pinned,
            [lambda: StreamPrefetch(normalize=norm, normalize_dtype="bfloat16", channels_last=True)],
        ),
    }
    runs: dict[str, list[float]] = {key: [] for key in cases}
    for _ in range(args.repeats):  # interleaved, so drift hits every case alike; the best run counts
        for key, (batches, callbacks) in cases.items():
            runs[key].append(step_ms(light(), batches, steps, warmup, [make() for make in callbacks], key))
    f.update({key: min(values) for key, values in runs.items()})
    f["runs_ms"] = runs
    del resident
    torch.cuda.empty_cache()

    def resnet() -> ImageClassifier:
        torch.manual_seed(0)
        return ImageClassifier("resnet50", num_classes=100, channels_last=True)

    resnet_runs: dict[str, list[float]] = {"resnet50_plain_ms": [], "resnet50_stream_prefetch_ms": []}
    for _ in range(args.repeats):
        resnet_runs["resnet50_plain_ms"].append(
            step_ms(resnet(), uint8_pinned, args.resnet_steps, warmup, name="resnet50_plain_ms")
        )
        resnet_runs["resnet50_stream_prefetch_ms"].append(
            step_ms(resnet(), uint8_pinned, args.resnet_steps, warmup, [StreamPrefetch()], "resnet50_stream_prefetch_ms")
        )
    f.update({key: min(values) for key, values in resnet_runs.items()})
    f["resnet50_runs_ms"] = resnet_runs

    f["windows"] = WINDOWS
    bound = max(f["copy_alone_ms"], f["compute_alone_ms"])
    bars = {
        "prefetch_step_over_max_copy_compute": bar(
            f["stream_prefetch_ms"] / bound, 1.05, "x", higher_is_better=False
        ),
        "prefetch_speedup_vs_plain": bar(f["plain_lightning_ms"] / f["stream_prefetch_ms"], 1.2, "x"),
        "uint8_bytes_reduction": bar(f["float32_batch_mb"] / f["uint8_batch_mb"], 4.0, "x"),
        "uint8_step_over_float32_prefetch_step": bar(
            f["uint8_gpu_normalize_ms"] / f["stream_prefetch_ms"], 1.0, "x", higher_is_better=False
        ),
        "resnet50_prefetch_step_over_plain_step": bar(
            f["resnet50_stream_prefetch_ms"] / f["resnet50_plain_ms"], 1.01, "x", higher_is_better=False
        ),
        "steady_state_halves_max_diff": bar(worst_halves_diff(WINDOWS), 0.05, "ratio", higher_is_better=False),
    }
    for key, value in f.items():
        if key != "windows":
            print(f"{key:>32}: {value}")
    for key, b in bars.items():
        print(f"{key:>40}: {b['value']:.3f} (target {b['target']}, pass={b['pass']})")
    config = {"batch_size": bs, "image_size": size, "width": args.width, "steps": steps, "warmup": warmup,
              "resnet_steps": args.resnet_steps, "repeats": args.repeats, "precision": "bf16-mixed"}  # fmt: skip
    print(f"wrote {write_result('stream_prefetch', {'config': config, **f}, bars, args.out)}")


if __name__ == "__main__":
    main()
