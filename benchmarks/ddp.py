"""ddp_boost vs Lightning's plain strategy="ddp" vs one GPU, ResNet-50 bf16 on resident uint8 batches, one run.

    python benchmarks/ddp.py                 # on a machine with 2+ GPUs
    python benchmarks/ddp.py --devices 2 --steps 40

Each configuration runs in its own process (Lightning launches the DDP ranks); per-rank throughput and peak
memory are written by every rank and combined here. Bars (issue 8): ddp_boost on 2 GPUs >= 1.9x one GPU; vs
plain "ddp": throughput no lower and peak GPU memory lower.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CONFIGS = {"one_gpu": ("auto", 1), "ddp": ("ddp", None), "ddp_boost": ("ddp_boost", None),
           "ddp_boost_static": ("ddp_boost_static", None), "ddp_boost_bf16": ("ddp_boost_bf16", None)}  # fmt: skip


def child(args: argparse.Namespace) -> None:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, Dataset

    import lightning_gpu_boost  # noqa: F401  (registers ddp_boost)
    from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
    from lightning_gpu_boost.models import ImageClassifier

    class ResidentBatches(Dataset):
        """uint8 batches created on this rank's GPU on first use; no host work per step."""

        def __init__(self, length: int) -> None:
            self.length, self.batches = length, None

        def __len__(self) -> int:
            return self.length

        def __getitem__(self, i: int):
            if self.batches is None:
                g = torch.Generator(device="cuda").manual_seed(torch.cuda.current_device())
                self.batches = [
                    (torch.randint(0, 256, (args.batch_size, 3, 224, 224), dtype=torch.uint8, device="cuda", generator=g),
                     torch.randint(0, 100, (args.batch_size,), device="cuda", generator=g))
                    for _ in range(2)
                ]  # fmt: skip
            return self.batches[i % 2]

    strategy, devices = CONFIGS[args.run]
    devices = devices or args.devices
    torch.backends.cudnn.benchmark = True
    meter = ThroughputMeter(warmup=args.warmup, sample_gpu_util=False)
    trainer = pl.Trainer(
        accelerator="gpu", devices=devices, strategy=strategy, precision="bf16-mixed",
        max_steps=args.warmup + args.steps, callbacks=[meter], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    torch.manual_seed(0)
    length = (args.warmup + args.steps + 2) * devices
    trainer.fit(
        ImageClassifier("resnet50", num_classes=100, channels_last=True),
        DataLoader(ResidentBatches(length), batch_size=None),
    )
    summary = meter.summary()
    summary["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    summary["world_size"] = trainer.world_size
    Path(args.rank_dir, f"{args.run}-rank{trainer.global_rank}.json").write_text(json.dumps(summary))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256, help="per GPU")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--run", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--rank-dir", default="/tmp/ddp-bench", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        return child(args)

    from lightning_gpu_boost.core.results import bar, write_result
    from lightning_gpu_boost.core.steady import worst_halves_diff

    os.makedirs(args.rank_dir, exist_ok=True)
    results = {}
    for name in CONFIGS:
        cmd = [sys.executable, __file__, "--run", name, "--rank-dir", args.rank_dir, "--devices", str(args.devices),
               "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup)]  # fmt: skip
        subprocess.run(cmd, check=True)
        ranks = [json.loads(p.read_text()) for p in sorted(Path(args.rank_dir).glob(f"{name}-rank*.json"))]
        results[name] = {
            "img_s": sum(r["samples_per_s"] for r in ranks),
            "step_ms": max(r["step_ms"] for r in ranks),
            "peak_memory_gib_rank0": ranks[0]["peak_memory_gib"],
            "ranks": ranks,
        }
        print(
            f"{name}: {results[name]['img_s']:,.0f} img/s, peak {results[name]['peak_memory_gib_rank0']:.2f} GiB"
        )
    one, ddp, boost = results["one_gpu"]["img_s"], results["ddp"]["img_s"], results["ddp_boost"]["img_s"]
    figures = {"config": {k: v for k, v in vars(args).items() if k not in ("run", "rank_dir")}, **results,
               "scaling": {name: r["img_s"] / one for name, r in results.items()}}  # fmt: skip
    bars = {
        "ddp_boost_scaling_vs_one_gpu": bar(boost / one, 1.9, "x"),
        "ddp_boost_throughput_vs_plain_ddp": bar(boost / ddp, 1.0, "x"),
        "ddp_boost_peak_memory_vs_plain_ddp": bar(
            results["ddp_boost"]["peak_memory_gib_rank0"] / results["ddp"]["peak_memory_gib_rank0"],
            1.0,
            "x",
            higher_is_better=False,
            strict=True,
        ),
        # each rank's ThroughputMeter window (queue skipped, halves compared): all steady?
        "steady_state_halves_max_diff": bar(
            worst_halves_diff({name: r["ranks"] for name, r in results.items()}), 0.05, "ratio",
            higher_is_better=False,
        ),
    }
    for key, b in bars.items():
        print(f"{key}: {b['value']} (target {b['target']}, pass={b['pass']})")
    print(f"wrote {write_result('ddp', figures, bars, args.out)}")


if __name__ == "__main__":
    main()
