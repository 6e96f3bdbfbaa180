"""GPUUtilWatchdog on the H100 machine: its overhead on a compute-bound ResNet-50, its warning on the plain
Lightning JPEG case, and its silence where the GPU is well fed, all in one run.

    python benchmarks/gpu_util_watchdog.py             # needs a CUDA GPU

Bars (issue 4):
- overhead <= 1 % of step time on the compute-bound ResNet-50 case (with vs without, interleaved, same run);
- on the plain-Lightning JPEG case (DataLoader defaults, num_workers=0) it warns within 50 steps after warm-up,
  with a diagnosis naming the worker count;
- zero warnings on the compute-bound case and on a well-fed loader.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
from _common import demo_tree, parser_for
from stream_prefetch import Batches, make_batches
from torch.utils.data import DataLoader, TensorDataset

from lightning_gpu_boost.baselines import plain_image_folder
from lightning_gpu_boost.callbacks import GPUUtilWatchdog, StreamPrefetch
from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.core.steady import worst_halves_diff
from lightning_gpu_boost.models import ImageClassifier


class StopWhenWarned(pl.Callback):
    def __init__(self, dog: GPUUtilWatchdog) -> None:
        self.dog = dog

    def on_train_batch_end(self, trainer, *args) -> None:
        if self.dog.warnings:
            trainer.should_stop = True


def fit(
    loader, callbacks, steps: int, warmup: int, precision: str = "bf16-mixed", arch: str = "resnet50"
) -> dict:
    torch.manual_seed(0)
    meter = ThroughputMeter(warmup=warmup, steps=steps, sample_gpu_util=False)  # ends fit: queue, drain, window
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, precision=precision, max_steps=100_000, callbacks=[meter, *callbacks],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(ImageClassifier(arch, num_classes=100, channels_last=precision != "32-true"), loader)
    return meter.summary()


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu_util_watchdog.py needs a CUDA GPU.")
    torch.backends.cudnn.benchmark = True
    bs, steps, warmup = args.batch_size, args.steps, args.warmup
    f: dict = {"config": vars(args)}

    # 1. compute-bound ResNet-50 on pinned uint8 batches: with vs without the watchdog, interleaved
    batches = make_batches(3, bs, 224, torch.uint8)
    runs: dict[str, list[float]] = {"without_ms": [], "with_ms": []}
    windows: dict[str, list[dict]] = {"without": [], "with": []}  # each run's steady window (core/steady.py)
    compute_dogs = []
    for _ in range(args.repeats):
        window = fit(DataLoader(Batches(batches, warmup + steps), batch_size=None), [], steps, warmup)
        windows["without"].append(window)
        runs["without_ms"].append(window["step_ms"])
        dog = GPUUtilWatchdog(warmup_steps=warmup)
        compute_dogs.append(dog)
        window = fit(DataLoader(Batches(batches, warmup + steps), batch_size=None), [dog], steps, warmup)
        windows["with"].append(window)
        runs["with_ms"].append(window["step_ms"])
    without, with_dog = min(runs["without_ms"]), min(runs["with_ms"])
    f["compute_bound"] = {**runs, "windows": windows, "overhead": with_dog / without - 1,
                          "summaries": [d.summaries for d in compute_dogs],
                          "warnings": [w["message"] for d in compute_dogs for w in d.warnings]}  # fmt: skip

    # 2. a well-fed loader: in-memory uint8 images, 4 workers, pinned, StreamPrefetch; an epoch holds the queue, its
    #    drain and the window (epochs of 8 batches timed their restarts)
    images = torch.randint(0, 256, (128 * bs, 3, 224, 224), dtype=torch.uint8)
    fed = DataLoader(TensorDataset(images, torch.randint(0, 100, (len(images),))), batch_size=bs, shuffle=True,
                     num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=4)  # fmt: skip
    fed_dog = GPUUtilWatchdog(warmup_steps=warmup)
    fed_run = fit(fed, [fed_dog, StreamPrefetch()], steps, warmup)
    f["well_fed"] = {
        **fed_run,
        "summaries": fed_dog.summaries,
        "warnings": [w["message"] for w in fed_dog.warnings],
    }
    del images, fed

    # 3. plain Lightning on JPEGs: torchvision-style float transforms, DataLoader defaults, fp32
    root = demo_tree(args)
    plain_dog = GPUUtilWatchdog(warmup_steps=warmup)
    plain = DataLoader(plain_image_folder(root, 224), batch_size=bs, shuffle=True)
    plain_run = fit(plain, [plain_dog, StopWhenWarned(plain_dog)], 50, warmup, precision="32-true")
    first = plain_dog.warnings[0] if plain_dog.warnings else None
    f["plain_jpeg"] = {
        **plain_run,
        "first_warning_step": first and first["step"],
        "message": first and first["message"],
    }
    steps_after_warmup = (first["step"] - warmup) if first else 50 + 1  # 51: no warning within 50 steps
    names_workers = bool(first) and "num_workers=0" in first["message"]

    warnings_where_fed = len(f["compute_bound"]["warnings"]) + len(f["well_fed"]["warnings"])
    bars = {
        "overhead_compute_bound": bar(
            f["compute_bound"]["overhead"], 0.01, "fraction", higher_is_better=False
        ),
        "plain_jpeg_warns_within_steps_after_warmup": bar(
            steps_after_warmup, 50, "steps", higher_is_better=False
        ),
        "plain_jpeg_diagnosis_names_num_workers": bar(float(names_workers), 1.0, "bool"),
        "warnings_compute_bound_and_well_fed": bar(warnings_where_fed, 0, "warnings", higher_is_better=False),
        # the timed cases (the plain JPEG run stops at its first warning: its figure is that step, not a rate)
        "steady_state_halves_max_diff": bar(
            worst_halves_diff({"compute_bound": windows, "well_fed": fed_run}), 0.05, "ratio", higher_is_better=False
        ),
    }
    print(
        f"compute-bound: {without:.2f} ms without, {with_dog:.2f} ms with ({100 * (with_dog / without - 1):+.2f} %)"
    )
    print(f"well fed: {fed_run['samples_per_s']:,.0f} img/s, warnings: {len(fed_dog.warnings)}")
    print(f"plain JPEG: first warning at step {first and first['step']}:\n{first and first['message']}")
    for key, b in bars.items():
        print(f"{key}: {b['value']} (target {b['target']}, pass={b['pass']})")
    print(f"wrote {write_result('gpu_util_watchdog', f, bars, args.out)}")


if __name__ == "__main__":
    main()
