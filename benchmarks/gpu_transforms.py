"""Per-sample transforms moved from the DataLoader workers to the GPU (``StreamPrefetch(transform=...)``, run on
the side stream one batch ahead), side by side with the same pipeline's CPU transforms, in one run.

    python benchmarks/gpu_transforms.py --data /tmp/workloads            # H100 machine (--size gpu there)
    python benchmarks/gpu_transforms.py --size cpu --data /tmp/wl --out /tmp   # a smoke run on CPU

Three pipelines, each at steady state (ThroughputMeter: the loader's queue drained first, the window's halves
recorded), every case with ``StreamPrefetch`` so that only where the transforms run differs:

- segmentation (``benchmarks/workloads/segmentation.py``: 640-px image + PNG mask pairs, U-Net on 512-px crops):
  the workload's per-sample rotation, elastic warp, crop, flip and colour jitter (torchvision.transforms.v2) in
  16 workers (all cores: its best hand-tuned loader), against workers that only decode and ``JointAugment(size=512,
  degrees=30, elastic=0.05, jitter=0.3)`` on the GPU;
- audio (``benchmarks/workloads/audio.py``: 3-8 s WAV clips at 44.1 kHz, conv + transformer encoder): resampling
  and log-mel per clip in its 4 workers, against the same 4 workers reading the waveforms and ``LogMel`` on the GPU;
- ImageNet-style (ResNet-50, bf16-mixed, channels_last, batch 256, 16 workers, 500 x 375 JPEGs whose colour
  carries the class): torchvision's RandomResizedCrop + flip + ToTensor + Normalize in the workers, against
  workers that only decode (``pad_collate``) and ``RandomResizedCropFlip`` on the GPU; the loss curves from the
  same initial weights are compared over their common steps, with a second CPU run (another seed: the run-to-run
  noise) and the GPU crops without antialiasing beside them.

The ceiling of each is its model's step on one transformed batch resident on the GPU. Overlap (GPU only): one
segmentation run of ``--overlap-steps`` steps on a resident raw batch that goes through the stage on a seeded half
of the batches (the batch transformed before on the others); each step's GPU period from CUDA events on the
training stream, a step counted as staged where it holds most of a stage's span (the stage's own events, on the
side stream), as unstaged where it shares none (steps in between left out);
the staged steps' mean period minus the others', over the stage's own GPU time (its kernels queued behind a
sleeping kernel, so that no launch gap counts). Steps with and without the stage thus alternate under the same
clocks, where separate runs differed by more than the stage (the step alone 109.0, 125.4 and 126.7 ms in three runs
on one machine: benchmarks/results/history/joint_augment_overlap_ab-2026-11-24-h100-e13f1b0-v1.json).

Bars (issue 18; ``gpu_transforms-<date>-<gpu>.json``): ``segmentation_gpu_vs_cpu`` >= 2,
``segmentation_gpu_of_ceiling`` >= 0.85, ``audio_gpu_vs_cpu_same_workers`` >= 3, ``imagenet_gpu_of_ceiling``
>= 0.80, ``imagenet_loss_gap`` (the GPU crops' mean loss over the last third of the steps all runs share, minus
the CPU transforms', in nats) <= twice the CPU transforms' own gap to a run with another seed (at least
0.05), ``overlap_extra_of_stage`` <= 0.30 ((step with the stage - the step alone) / the
stage's GPU time; its standard error beside it) and ``steady_state_halves_max_diff`` <= 0.05 over the cells
whose rates the bars read (ImageNet's CPU transforms feed the loss bar their losses; their rate, 16 workers on 16
cores beside the training process, is reported with its halves but is no bar's).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "workloads"))  # the workloads' projects, imported by module name
sys.path.insert(1, str(HERE.parent))

import lightning.pytorch as pl  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from lightning.fabric.utilities.apply_func import move_data_to_device  # noqa: E402
from torch.utils.data import DataLoader, Dataset, default_collate  # noqa: E402

from lightning_gpu_boost.callbacks import StreamPrefetch  # noqa: E402
from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter  # noqa: E402
from lightning_gpu_boost.core.gpu_transforms import JointAugment, LogMel, RandomResizedCropFlip, pad_collate  # noqa: E402
from lightning_gpu_boost.core.results import bar, environment, write_result  # noqa: E402
from lightning_gpu_boost.core.steady import ResidentBatches, worst_halves_diff  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZES = {
    "cpu": {"images": 256, "classes": 4, "batch": 16, "crop": 64, "workers": 2, "steps": 12, "pairs": 96,
            "clips": 256},
    "gpu": {"images": 32000, "classes": 100, "batch": 256, "crop": 224, "workers": 16, "steps": 64, "pairs": 4096,
            "clips": 4096},
}  # fmt: skip
"""ImageNet-style images and the segmentation pairs and audio clips each pipeline reads: enough that warm-up, the
queue's drain and the window fit in one epoch (an epoch's restart stalls while the workers refill)."""


# --- the data the projects read -------------------------------------------------------------------------------


from _best import Decoded, RawPairs, Waves, pad_waves  # noqa: E402  (the workers' side of each pipeline)
from _common import carried_over  # noqa: E402

# --- one timed run ----------------------------------------------------------------------------------------------


class LossLog(pl.Callback):
    """Every training step's loss, kept on the device until the end (no sync per step)."""

    def __init__(self) -> None:
        self.losses: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(loss.detach().float())

    def values(self) -> list[float]:
        return torch.stack(self.losses).cpu().tolist() if self.losses else []


def loader(dataset: Dataset, batch: int, workers: int, gpu: bool, collate=None) -> DataLoader:
    """The hand-tuned loader: shuffled, ``workers`` persistent workers, pinned memory, 2 batches each queued."""
    return DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers, pin_memory=gpu,
                      persistent_workers=workers > 0, prefetch_factor=2 if workers else None, drop_last=True,
                      collate_fn=collate or default_collate)  # fmt: skip


def timed_fit(model: pl.LightningModule, train: Any, args, transform=None, precision: str = "32-true",
              steps: int | None = None, max_steps: int = 100_000, seed: int = 0) -> dict[str, Any]:
    """``seed`` sets the shuffle order and the workers' random draws (not the model's initial weights)."""
    gpu = args.size == "gpu"
    torch.manual_seed(seed)
    meter = ThroughputMeter(warmup=10 if gpu else 3, steps=steps or args.cfg["steps"], sample_gpu_util=False)
    losses = LossLog()
    trainer = pl.Trainer(
        accelerator="gpu" if gpu else "cpu", devices=1, precision=precision, max_steps=max_steps,
        max_epochs=-1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[meter, losses, StreamPrefetch(transform=transform, transform_seed=0)],
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, train)
    return {**meter.summary(), "losses": losses.values()}


def ceiling(make_model, raw_batch: Any, transform, args, precision: str = "32-true") -> tuple[dict, Any]:
    """The model's step on one transformed batch resident on the device, and that batch."""
    device = torch.device("cuda" if args.size == "gpu" else "cpu")
    torch.manual_seed(0)
    batch = move_data_to_device(raw_batch, device)
    if transform is not None:
        batch = transform(batch)
    steps = 3 * args.cfg["steps"]
    return timed_fit(make_model(), ResidentBatches(batch, steps), args, precision=precision, max_steps=steps), batch


def stage_ms(transform, raw_batch: Any, args, repeats: int = 8) -> float:
    """The transform's own GPU time on a resident raw batch: ``repeats`` calls queued behind a sleeping kernel, so
    that their kernels run back to back, timed by CUDA events around them (the wall time of a synchronized loop
    would count the host's launches wherever they are slower than the kernels). Few calls: the driver's launch
    queue (about a thousand kernels) blocks the host once full (JointAugment: at its 16th call). On CPU: the wall
    time."""
    device = torch.device("cuda" if args.size == "gpu" else "cpu")
    batch = move_data_to_device(raw_batch, device)
    for _ in range(3):
        transform(batch)
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(repeats):
            transform(batch)
        return 1000 * (time.perf_counter() - start) / repeats
    cycles = 200_000_000  # ~0.1 s at the H100's clock: longer than the host takes to launch the calls
    for _ in range(4):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        start.record()
        for _ in range(repeats):
            transform(batch)
        end.record()
        queued = not start.query()  # the sleep still ran after the last call was launched: none waited on the host
        torch.cuda.synchronize()
        if queued:
            return start.elapsed_time(end) / repeats
        cycles *= 4
    raise RuntimeError("the stage's launches outlasted a sleep of 800 M cycles; its GPU time cannot be isolated")


class SometimesStaged:
    """A transform for the overlap measurement: on a seeded half of the batches the stage, between two CUDA events
    on the (side) stream it runs on; on the others the batch transformed once before (no GPU work)."""

    def __init__(self, transform, done: Any, seed: int = 0) -> None:
        import random

        self.transform, self.done, self.rng = transform, done, random.Random(seed)
        self.spans: list[tuple[Any, Any]] = []

    def __call__(self, batch: Any) -> Any:
        if self.rng.random() < 0.5:
            return self.done
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = self.transform(batch)
        end.record()
        self.spans.append((start, end))
        return out


class StepStarts(pl.Callback):
    """A CUDA event on the training stream as each step starts: the GPU's step periods, read after the run."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.events.append(event)


def overlap_in_one_run(make_model, raw_batch: Any, transform, args, steps: int, warmup: int = 20) -> dict[str, Any]:
    """The step's GPU period with the stage running beside it against without, within one run: the resident raw
    batch goes through the stage on a seeded half of the batches (the batch transformed before on the others), so
    that the two kinds of step alternate at random under the same clocks and temperature; a step counts as staged
    where most of a stage's span (its events) falls in its period, as unstaged where none does. ``extra_ms``: the
    difference of the two kinds' mean periods."""
    device = torch.device("cuda")
    torch.manual_seed(0)
    resident = move_data_to_device(raw_batch, device)
    done = transform(resident)
    sometimes, starts = SometimesStaged(transform, done), StepStarts()
    trainer = pl.Trainer(
        accelerator="gpu", devices=1, max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[starts, StreamPrefetch(transform=sometimes, transform_seed=0)],
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(make_model(), ResidentBatches(resident, steps))
    torch.cuda.synchronize()
    origin = starts.events[0]
    t = np.array([origin.elapsed_time(e) for e in starts.events])
    spans = np.array([(origin.elapsed_time(a), origin.elapsed_time(b)) for a, b in sometimes.spans])
    # each step's time shared with a stage (a stage starts as the step before the one it overlaps ends, so its
    # start event may fall just inside that step): staged where it holds most of a stage, unstaged where none,
    # left out in between
    periods, shared = np.diff(t), np.zeros(len(t) - 1)
    for a, b in spans:
        shared = np.maximum(shared, (np.minimum(t[1:], b) - np.maximum(t[:-1], a)).clip(min=0) / (b - a))
    periods, shared = periods[warmup:], shared[warmup:]
    staged, clean = shared >= 0.5, shared == 0
    with_, without = periods[staged], periods[clean]
    se = float(np.sqrt(with_.var(ddof=1) / len(with_) + without.var(ddof=1) / len(without)))
    return {"steps": int(len(periods)), "staged_steps": int(staged.sum()), "unstaged_steps": int(clean.sum()),
            "with_stage_ms": float(with_.mean()),
            "without_stage_ms": float(without.mean()), "extra_ms": float(with_.mean() - without.mean()),
            "extra_se_ms": se, "with_stage_median_ms": float(np.median(with_)),
            "without_stage_median_ms": float(np.median(without)),
            "stage_beside_step_ms": float(np.median(spans[:, 1] - spans[:, 0]))}  # fmt: skip


def ms_per_step(result: dict[str, Any], batch: int) -> float:
    return 1000 * batch / result["samples_per_s"]


# --- the three pipelines ----------------------------------------------------------------------------------------


def segmentation(args) -> dict[str, Any]:
    import segmentation as seg

    seg.SIZES[args.size] = cfg = {**seg.SIZES[args.size], "pairs": args.cfg["pairs"]}
    data = seg.prepare(Path(args.data), args.size)
    workers = os.cpu_count() if args.size == "gpu" else cfg["workers"]
    crop, batch = cfg["crop"], cfg["batch"]

    def model():
        return seg.UNet(cfg["classes"], cfg["width"])

    aug = JointAugment(size=crop, degrees=30.0, elastic=0.05, jitter=0.3, ignore_index=0)
    raw = next(iter(DataLoader(RawPairs(data), batch_size=batch)))
    result: dict[str, Any] = {"workers": workers, "batch": batch, "crop": crop}
    print("segmentation: CPU transforms ...", flush=True)
    result["cpu"] = timed_fit(model(), loader(seg.Pairs(data, crop), batch, workers, args.size == "gpu"), args)
    print("segmentation: GPU transforms ...", flush=True)
    result["gpu"] = timed_fit(model(), loader(RawPairs(data), batch, workers, args.size == "gpu"), args, aug)
    print("segmentation: ceiling ...", flush=True)
    result["ceiling"], _ = ceiling(model, raw, aug, args)
    # overlap: the stage beside the step against the step alone, both kinds of step in one run (see
    # overlap_in_one_run), over the stage's own GPU time
    result["stage_ms"] = stage_ms(aug, raw, args)
    if args.size == "gpu":
        result["overlap"] = o = overlap_in_one_run(model, raw, aug, args, steps=args.overlap_steps)
        result["compute_ms"] = ms_per_step(result["ceiling"], batch)
        result["overlap_extra_of_stage"] = o["extra_ms"] / result["stage_ms"]
        result["overlap_extra_se_of_stage"] = o["extra_se_ms"] / result["stage_ms"]
    result["gpu_vs_cpu"] = result["gpu"]["samples_per_s"] / result["cpu"]["samples_per_s"]
    result["gpu_of_ceiling"] = result["gpu"]["samples_per_s"] / result["ceiling"]["samples_per_s"]
    return result


def audio(args) -> dict[str, Any]:
    import audio as au

    au.SIZES[args.size] = cfg = {**au.SIZES[args.size], "clips": args.cfg["clips"]}
    data = au.prepare(Path(args.data), args.size)
    workers, batch = cfg["workers"], cfg["batch"]

    def model():
        return au.Encoder(cfg["dim"], cfg["layers"])

    mel = LogMel(source_rate=au.SOURCE_RATE, rate=au.RATE, n_fft=au.N_FFT, hop=au.HOP, n_mels=au.MELS)
    result: dict[str, Any] = {"workers": workers, "batch": batch}
    print("audio: CPU features ...", flush=True)
    result["cpu"] = timed_fit(model(), loader(au.Clips(data), batch, workers, args.size == "gpu", au.collate), args)
    print("audio: GPU features ...", flush=True)
    result["gpu"] = timed_fit(model(), loader(Waves(data), batch, workers, args.size == "gpu", pad_waves), args, mel)
    raw = next(iter(DataLoader(Waves(data), batch_size=batch, collate_fn=pad_waves)))
    result["ceiling"], _ = ceiling(model, raw, mel, args)
    result["stage_ms"] = stage_ms(mel, raw, args)
    result["gpu_vs_cpu"] = result["gpu"]["samples_per_s"] / result["cpu"]["samples_per_s"]
    result["gpu_of_ceiling"] = result["gpu"]["samples_per_s"] / result["ceiling"]["samples_per_s"]
    return result


def imagenet(args) -> dict[str, Any]:
    from jpeg_classification import Folder

    from lightning_gpu_boost.models import ImageClassifier

    cfg = args.cfg
    from _images import jpeg_tree

    data = jpeg_tree(Path(args.data) / f"signal-{cfg['images']}-{cfg['classes']}", cfg["images"], cfg["classes"],
                     (500, 375), class_colour=True)  # fmt: skip
    workers = cfg["workers"] if args.size == "gpu" else 2
    batch, crop, gpu = cfg["batch"], cfg["crop"], args.size == "gpu"
    precision = "bf16-mixed" if gpu else "32-true"

    def model():
        torch.manual_seed(0)  # the same initial weights for every case
        return ImageClassifier("resnet50" if gpu else "small_cnn", num_classes=cfg["classes"], channels_last=gpu)

    rrc = RandomResizedCropFlip(crop, normalize=(MEAN, STD))
    result: dict[str, Any] = {"workers": workers, "batch": batch, "precision": precision}
    print("imagenet: CPU transforms ...", flush=True)
    result["cpu"] = timed_fit(model(), loader(Folder(data, crop), batch, workers, gpu), args, precision=precision)
    print("imagenet: GPU transforms ...", flush=True)
    result["gpu"] = timed_fit(model(), loader(Decoded(data), batch, workers, gpu, pad_collate), args, rrc,
                              precision=precision)  # fmt: skip
    print("imagenet: CPU transforms, another seed; GPU crops without antialiasing ...", flush=True)
    result["cpu_seed1"] = timed_fit(model(), loader(Folder(data, crop), batch, workers, gpu), args,
                                    precision=precision, seed=1)  # fmt: skip
    result["gpu_aliased"] = timed_fit(model(), loader(Decoded(data), batch, workers, gpu, pad_collate), args,
                                      RandomResizedCropFlip(crop, normalize=(MEAN, STD), antialias=False),
                                      precision=precision)  # fmt: skip
    raw = next(iter(DataLoader(Decoded(data), batch_size=batch, collate_fn=pad_collate)))
    result["ceiling"], _ = ceiling(model, raw, rrc, args, precision=precision)
    result["stage_ms"] = stage_ms(rrc, raw, args)
    result["gpu_of_ceiling"] = result["gpu"]["samples_per_s"] / result["ceiling"]["samples_per_s"]
    result["cpu_of_ceiling"] = result["cpu"]["samples_per_s"] / result["ceiling"]["samples_per_s"]
    result["gpu_vs_cpu"] = result["gpu"]["samples_per_s"] / result["cpu"]["samples_per_s"]
    result["loss"] = loss_gaps(result)
    return result


def tail_mean(losses: list[float], common: int) -> float:
    """The mean loss over the last third of the first ``common`` steps."""
    return float(np.mean(losses[2 * common // 3 : common]))


def loss_gaps(result: dict[str, Any]) -> dict[str, Any]:
    """Each run's mean loss over the last third of the steps all runs share, and the gaps that decide the bar:
    GPU crops vs CPU transforms, against the CPU transforms' own run-to-run gap (another seed)."""
    runs = {k: result[k]["losses"] for k in ("cpu", "cpu_seed1", "gpu", "gpu_aliased") if k in result}
    common = min(len(v) for v in runs.values())
    tails = {k: tail_mean(v, common) for k, v in runs.items()}
    noise = abs(tails["cpu_seed1"] - tails["cpu"]) if "cpu_seed1" in tails else float("nan")
    return {"common_steps": common, "tail_mean": tails, "gap_gpu_nats": abs(tails["gpu"] - tails["cpu"]),
            "gap_noise_nats": noise, "target_nats": max(2 * noise, LOSS_GAP_FLOOR),
            "gap_aliased_nats": abs(tails["gpu_aliased"] - tails["cpu"]) if "gpu_aliased" in tails else None}


#: the loss bar's target is twice the CPU transforms' own seed-to-seed gap, and never below this (nats)
LOSS_GAP_FLOOR = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["cpu", "gpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data", default=".workloads-data", help="where the pipelines' data is written (and reused)")
    parser.add_argument("--only", nargs="+", choices=["segmentation", "audio", "imagenet"])
    parser.add_argument("--out", default="benchmarks/results", help="where the JSON and Markdown results go")
    parser.add_argument(
        "--keep",
        help="an earlier gpu_transforms result (JSON): its pipelines that --only does not re-run are carried "
        "over, each with the commit it was measured at",
    )
    parser.add_argument("--overlap-steps", type=int, default=400,
                        help="steps of the segmentation run that measures the overlap (half of them staged)")
    args = parser.parse_args()
    args.cfg = SIZES[args.size]
    if args.size == "gpu" and not torch.cuda.is_available():
        raise SystemExit("--size gpu needs a CUDA GPU.")
    figures: dict[str, Any] = {"size": args.size}
    commit = environment().get("git_commit")
    for name, run in (("segmentation", segmentation), ("audio", audio), ("imagenet", imagenet)):
        if args.only and name not in args.only:
            continue
        figures[name] = r = run(args)
        r["git_commit"] = commit
        print(f"{name}: CPU {r['cpu']['samples_per_s']:,.1f}/s, GPU {r['gpu']['samples_per_s']:,.1f}/s "
              f"({r['gpu_vs_cpu']:.2f}x), ceiling {r['ceiling']['samples_per_s']:,.1f}/s "
              f"({100 * r['gpu_of_ceiling']:.0f} % of it), stage {r['stage_ms']:.2f} ms", flush=True)  # fmt: skip
    if args.keep:  # carried over, with the commit each was measured at
        figures.update(carried_over(args.keep, [n for n in ("segmentation", "audio", "imagenet") if n not in figures]))
        figures = {"size": args.size, **{n: figures[n] for n in ("segmentation", "audio", "imagenet") if n in figures}}
    bars: dict[str, Any] = {}
    if "segmentation" in figures:
        s = figures["segmentation"]
        bars["segmentation_gpu_vs_cpu"] = bar(s["gpu_vs_cpu"], 2.0, "x")
        bars["segmentation_gpu_of_ceiling"] = bar(s["gpu_of_ceiling"], 0.85, "ratio")
        if "overlap_extra_of_stage" in s:
            bars["overlap_extra_of_stage"] = bar(s["overlap_extra_of_stage"], 0.30, "ratio", higher_is_better=False)
    if "audio" in figures:
        bars["audio_gpu_vs_cpu_same_workers"] = bar(figures["audio"]["gpu_vs_cpu"], 3.0, "x")
    if "imagenet" in figures:
        bars["imagenet_gpu_of_ceiling"] = bar(figures["imagenet"]["gpu_of_ceiling"], 0.80, "ratio")
        loss = figures["imagenet"]["loss"]
        bars["imagenet_loss_gap"] = bar(loss["gap_gpu_nats"], loss["target_nats"], "nats", higher_is_better=False)
    # the cells whose rates the bars read (imagenet's CPU transforms give the loss bar their losses, not a rate:
    # 16 workers on 16 cores beside the training process, their rate wanders; its halves stay in the figures)
    read = {"segmentation": ("cpu", "gpu", "ceiling"), "audio": ("cpu", "gpu", "ceiling"), "imagenet": ("gpu", "ceiling")}
    cases = [{c: figures[n][c] for c in cells} for n, cells in read.items() if n in figures]
    bars["steady_state_halves_max_diff"] = bar(worst_halves_diff(cases), 0.05, "ratio", higher_is_better=False)
    for key, b in bars.items():
        print(f"{key}: {b['value']} (target {b['target']}, pass={b['pass']})")
    print(f"wrote {write_result('gpu_transforms', figures, bars, args.out)}")


if __name__ == "__main__":
    main()
