"""Diagnosis: does a busy GPU slow DALIDataModule's pipeline down, and how are the training loop's waits spread?

    python benchmarks/dali_contention.py

1. The train loader alone (no training): img/s.
2. The same while another thread keeps the GPU's SMs busy with bf16 matmuls on its own stream: img/s.
3. ResNet-50 training in a Lightning Trainer, first on the ceiling's resident batch, then on DALIDataModule: each
   step's host wait for its batch (percentiles, the steps that waited longest) and, from CUDA events at the step's
   edges, the GPU's idle gap before each step and its busy time (gaps at epoch boundaries are not counted).
   ``--train-only`` skips 1 and 2.
"""

from __future__ import annotations

import statistics
import threading
import time

import lightning.pytorch as pl
import torch
from _common import demo_tree, fit_resnet50, parser_for
from dali import _value

from lightning_gpu_boost.core.results import write_result
from lightning_gpu_boost.core.steady import ResidentBatches
from lightning_gpu_boost.core.step_timer import StepTimer
from lightning_gpu_boost.datamodules.dali import DALIDataModule


def loader_rate(dm: DALIDataModule, batches: int) -> float:
    loader = dm.train_dataloader()
    it = iter(loader)
    for _ in range(8):
        next(it)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(batches):
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
            next(it)
    torch.cuda.synchronize()
    return batches * dm.batch_size / (time.perf_counter() - t0)


class GPUHog(threading.Thread):
    """bf16 matmuls on a side stream until stopped (a stand-in for a training step's kernels)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.kernels = 0

    def run(self) -> None:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not self.stop.is_set():
                for _ in range(8):
                    a @ a
                self.kernels += 8
                stream.synchronize()


class Waits(pl.Callback):
    """Per step: the host's wait for the batch, and (CUDA events) the GPU's idle gap before the step."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self._end: float | None = None
        self.timer = StepTimer(cuda=True)
        self.timings = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._end is not None:
            self.waits.append(1000 * (time.perf_counter() - self._end))
        if batch_idx == 0:
            self.timer.skip_next_gap()  # an epoch boundary
        self.timer.step_start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._end = time.perf_counter()
        self.timer.step_end(trainer.global_step)
        self.timings += self.timer.pop_ready()

    def on_train_end(self, trainer, pl_module) -> None:
        torch.cuda.synchronize()
        self.timings += self.timer.pop_ready()

    def gpu(self, skip: int) -> dict:
        """GPU idle gaps and busy time per step after ``skip`` steps (epoch boundaries: gaps not counted)."""
        t = self.timings[skip:]
        gaps = [x.gpu_gap_ms for x in t if x.gpu_gap_ms == x.gpu_gap_ms]
        busy = [x.gpu_step_ms for x in t]
        return {"gap_ms_sum": sum(gaps), "gap_ms_median": statistics.median(gaps), "gap_ms_max": max(gaps),
                "gaps_over_1ms": sum(g > 1 for g in gaps), "busy_ms_mean": statistics.mean(busy),
                "gaps_ms": [round(g, 2) for g in gaps], "busy_ms": [round(b, 2) for b in busy]}  # fmt: skip


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--batches", type=int, default=64)
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument(
        "--variants", nargs="*", default=[], help="DALIDataModule options, e.g. hw_decoder_load=0.65"
    )
    parser.add_argument("--no-train", dest="train", action="store_false", help="skip the training part")
    parser.add_argument("--train-only", action="store_true", help="skip the loader rates")
    args = parser.parse_args()
    root = demo_tree(args)

    def datamodule(**options) -> DALIDataModule:
        return DALIDataModule(
            str(root), batch_size=args.batch_size, **{"dtype": "bfloat16", "channels_last": True, **options}
        )

    def rates(**options) -> dict:
        dm = datamodule(**options)
        alone = loader_rate(dm, args.batches)
        dm.teardown("fit")
        hog = GPUHog()
        hog.start()
        time.sleep(1.0)
        dm = datamodule(**options)
        k0, t0 = hog.kernels, time.perf_counter()
        busy = loader_rate(dm, args.batches)
        hog_rate = (hog.kernels - k0) / (time.perf_counter() - t0)
        hog.stop.set()
        hog.join()
        dm.teardown("fit")
        print(f"DALI loader {options or 'defaults'}: alone {alone:,.0f} img/s; with the GPU busy {busy:,.0f} img/s "
              f"({hog_rate:.0f} matmuls/s)")  # fmt: skip
        return {"options": options, "alone_img_s": alone, "gpu_busy_img_s": busy, "hog_matmuls_s": hog_rate}

    loaders = [] if args.train_only else [rates()]
    for variant in [] if args.train_only else args.variants:
        loaders.append(
            rates(**{k: _value(v) for k, v in (item.split("=", 1) for item in variant.split(","))})
        )
    if not args.train:
        print(
            f"wrote {write_result('dali_contention', {'config': vars(args), 'loaders': loaders}, {}, args.out)}"
        )
        return

    def train(data) -> Waits:
        waits = Waits()
        fit_resnet50(data, args.steps, [waits])
        return waits

    x = torch.randn(args.batch_size, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    batch = (
        x.contiguous(memory_format=torch.channels_last),
        torch.randint(0, 100, (args.batch_size,), device="cuda"),
    )
    ceiling = train(ResidentBatches(batch, -(-args.images // args.batch_size))).gpu(32)
    print(
        f"ceiling: GPU gaps {ceiling['gap_ms_sum']:.1f} ms in all, busy {ceiling['busy_ms_mean']:.2f} ms per step"
    )
    t0 = time.perf_counter()
    waits = train(datamodule())
    gpu = waits.gpu(32)
    print(f"DALI: GPU gaps {gpu['gap_ms_sum']:.1f} ms in all ({gpu['gaps_over_1ms']} over 1 ms, max "
          f"{gpu['gap_ms_max']:.1f}), busy {gpu['busy_ms_mean']:.2f} ms per step; gaps {gpu['gaps_ms']}")  # fmt: skip
    w = waits.waits[32:]  # after the first epoch
    q = statistics.quantiles(w, n=20)
    longest = sorted(range(len(w)), key=lambda i: -w[i])[:8]
    print(f"training: waits per step after the first epoch: median {statistics.median(w):.1f} ms, p90 {q[17]:.1f}, "
          f"p95 {q[18]:.1f}, max {max(w):.1f}; longest at steps {[32 + 1 + i for i in longest]}")  # fmt: skip
    figures = {"config": vars(args), "loaders": loaders, "waits_ms": w, "wait_median_ms": statistics.median(w),
               "wait_p90_ms": q[17], "wait_p95_ms": q[18], "wall_s": time.perf_counter() - t0,
               "gpu_ceiling": ceiling, "gpu_dali": gpu}  # fmt: skip
    print(f"wrote {write_result('dali_contention', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
