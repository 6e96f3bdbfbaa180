"""AutoNumWorkers' probe vs a full sweep on five loaders, and ResNet-50 training vs a hand-tuned loader, in one run.

    python benchmarks/auto_num_workers.py                  # H100 machine defaults
    python benchmarks/auto_num_workers.py --quick --out /tmp   # CPU-sized smoke run

The five loaders, each written the way its users write it (plain torch / torchvision, the user's own
``num_workers``) on data generated here:

- ``jpeg``: torchvision ``ImageFolder`` (RandomResizedCrop, flip, ToTensor, Normalize) on ~71 KiB JPEGs, batch 256,
  ``num_workers=4``;
- ``photos``: the same on 12 MP camera-size JPEGs (4000 x 3000), batch 16, ``num_workers=4``;
- ``rows``: 1,000,000 rows of 64 floats read one by one through ``__getitem__``, batch 8,192, ``num_workers=0``;
- ``logmel``: 4 s WAV clips at 44.1 kHz read from disk, resampled to 16 kHz and turned into 80-band log-mel
  features per sample (``torch.stft``), batch 32, ``num_workers=4``;
- ``tokens``: windows of 1,025 tokens from a ``np.memmap`` token file, batch 64, ``num_workers=2``.

For each: the probe (``tune_num_workers``, its default 30 s budget, timed end to end) and a full sweep at the
loader's own batch size (every count timed in steady state by ``core/steady.py``: the queue skipped, at least
``--sweep-seconds`` per count, halves compared). The probe's choice is scored by the sweep's rate at that count.

Bars (issue 23): ``probe_of_sweep_best_min`` (the worst, over the five loaders, of sweep[choice] / sweep's best)
>= 0.95; ``probe_seconds_max`` <= 30; ``steady_state_halves_max_diff`` (every timed window) <= 0.05.
"""

from __future__ import annotations

import os
import statistics
import time
import wave
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from _common import demo_tree, parser_for
from torch.utils.data import DataLoader, Dataset

from lightning_gpu_boost.baselines import plain_image_folder
from lightning_gpu_boost.callbacks import AutoNumWorkers, StreamPrefetch
from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
from lightning_gpu_boost.core.images import IMAGENET_MEAN, IMAGENET_STD, make_jpeg_folder
from lightning_gpu_boost.core.loader_rate import clone_loader, measure_loader
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.core.steady import worst_halves_diff
from lightning_gpu_boost.core.workers import tune_num_workers
from lightning_gpu_boost.datamodules import ImageFolderDataModule
from lightning_gpu_boost.models import ImageClassifier

# ----------------------------------------------------------------------------------------- the users' datasets


class Rows(Dataset):
    """Tabular rows kept in memory, read one by one."""

    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 64)
        self.y = torch.randint(0, 2, (n,))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def write_wavs(root: Path, n: int, seconds: float = 4.0, rate: int = 44_100) -> Path:
    done = root / ".complete"
    if done.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * rate)) / rate
    for i in range(n):
        tone = np.sin(2 * np.pi * rng.uniform(100, 2000) * t) * 0.3 + rng.normal(0, 0.05, t.shape)
        with wave.open(str(root / f"clip_{i:05d}.wav"), "wb") as f:
            f.setnchannels(1)
            f.setsampwidth(2)
            f.setframerate(rate)
            f.writeframes((np.clip(tone, -1, 1) * 32767).astype("<i2").tobytes())
    done.touch()
    return root


def mel_filterbank(n_fft: int, n_mels: int, rate: int) -> torch.Tensor:
    def mel(f):
        return 2595 * np.log10(1 + f / 700)

    points = 700 * (10 ** (np.linspace(mel(0), mel(rate / 2), n_mels + 2) / 2595) - 1)
    bins = np.floor((n_fft + 1) * points / rate).astype(int)
    fb = np.zeros((n_mels, n_fft // 2 + 1), dtype=np.float32)
    for m in range(1, n_mels + 1):
        lo, mid, hi = bins[m - 1], bins[m], bins[m + 1]
        fb[m - 1, lo:mid] = (np.arange(lo, mid) - lo) / max(1, mid - lo)
        fb[m - 1, mid:hi] = (hi - np.arange(mid, hi)) / max(1, hi - mid)
    return torch.from_numpy(fb)


class LogMelClips(Dataset):
    """WAV clips -> 16 kHz -> 80-band log-mel, per sample (what a voice model's dataset does in its workers)."""

    def __init__(self, root: Path, rate: int = 16_000) -> None:
        self.files = sorted(root.glob("*.wav"))
        self.rate = rate
        self.mel = mel_filterbank(400, 80, rate)
        self.window = torch.hann_window(400)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        with wave.open(str(self.files[i]), "rb") as f:
            source_rate = f.getframerate()
            pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
        audio = torch.from_numpy(pcm.astype(np.float32) / 32768)
        try:
            import torchaudio.functional as AF

            audio = AF.resample(audio, source_rate, self.rate)
        except ImportError:  # CI has no torchaudio: linear resampling
            size = int(len(audio) * self.rate / source_rate)
            audio = torch.nn.functional.interpolate(audio[None, None], size=size, mode="linear")[0, 0]
        spec = torch.stft(audio, 400, 160, window=self.window, return_complex=True).abs() ** 2
        return torch.log(self.mel @ spec + 1e-6)


class TokenWindows(Dataset):
    """Random-access windows of a token file (nanoGPT's ``np.memmap`` of uint16)."""

    def __init__(self, path: Path, context: int = 1024) -> None:
        self.path, self.context = path, context
        self.n = (os.path.getsize(path) // 2 - 1) // context

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        chunk = torch.from_numpy(tokens[i * self.context : (i + 1) * self.context + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


def make_tokens(path: Path, n_tokens: int) -> Path:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        rng.integers(0, 50_257, n_tokens, dtype=np.uint16).tofile(path)
    return path


def loaders(args) -> dict[str, tuple[DataLoader, list[int]]]:
    """name -> (the user's loader, the sweep's counts)."""
    data = Path(args.data)
    q = args.quick
    jpeg = demo_tree(args)
    photos = make_jpeg_folder(data / f"photos-{args.photos}", n=args.photos, num_classes=2,
                              size_range=(4000, 4000, 3000, 3000), progress=False)  # fmt: skip
    wavs = write_wavs(data / f"wav-{args.clips}", args.clips)
    tokens = make_tokens(data / "tokens" / f"train-{args.tokens}.bin", args.tokens)
    heavy, full = args.sweep_heavy, args.sweep
    return {
        "jpeg": (DataLoader(plain_image_folder(jpeg, 224), batch_size=args.batch_size, shuffle=True,
                            num_workers=4, pin_memory=True), heavy),  # fmt: skip
        "photos": (DataLoader(plain_image_folder(photos, 224), batch_size=4 if q else 16, shuffle=True,
                              num_workers=4, pin_memory=True), heavy),  # fmt: skip
        "rows": (DataLoader(Rows(args.rows), batch_size=1024 if q else 8192, shuffle=True), full),
        "logmel": (DataLoader(LogMelClips(wavs), batch_size=32, shuffle=True, num_workers=4), full),
        "tokens": (DataLoader(TokenWindows(tokens), batch_size=64, shuffle=True, num_workers=2), full),
    }


# --------------------------------------------------------------------------------------------------- the run


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--quick", action="store_true", help="CPU-sized data and sweeps (a smoke run)")
    parser.add_argument("--photos", type=int, default=64, help="12 MP JPEGs")
    parser.add_argument("--clips", type=int, default=512, help="WAV clips")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tokens", type=int, default=50_000_000)
    parser.add_argument("--only", nargs="+", help="loaders to run (default: all five)")
    parser.add_argument("--prepare-only", action="store_true", help="write the data of the five loaders, then stop")
    parser.add_argument("--sweep", type=int, nargs="+", default=[0, 1, 2, 4, 8, 12, 16])
    parser.add_argument("--sweep-heavy", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16],
                        help="counts swept on the JPEG loaders (0 workers loads like 1, at far more time)")
    parser.add_argument("--sweep-seconds", type=float, default=2.0, help="shortest timed window per swept count")
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--sweep-passes", type=int, default=3,
                        help="interleaved passes over the counts, median kept (loaders whose pass is quick)")
    parser.add_argument("--repeat-below-s", type=float, default=45.0,
                        help="another pass only while the passes so far took less than this each")
    parser.add_argument("--train-steps", type=int, default=64, help="ResNet-50 steps after the queue (0: skip)")
    parser.set_defaults(images=64000)  # the tree of gpu_boost.py and bench: queue, drain and window in one epoch
    args = parser.parse_args()
    if args.quick:
        args.images, args.photos, args.clips, args.rows, args.tokens = 400, 6, 48, 100_000, 2_000_000
        args.sweep, args.sweep_heavy, args.sweep_seconds, args.budget = [0, 1, 2], [1, 2], 0.5, 15.0
        args.batch_size, args.train_steps = 32, 0
    results: dict[str, dict] = {}
    built = loaders(args)
    if args.prepare_only:
        print(f"data ready: {', '.join(built)}")
        return
    for name, (loader, counts) in built.items():
        if args.only and name not in args.only:
            continue
        print(f"{name}: probing (budget {args.budget:.0f} s) ...", flush=True)
        start = time.perf_counter()
        probe = tune_num_workers(loader, budget_s=args.budget)
        probe_s = time.perf_counter() - start
        print(f"{name}: chose {probe.num_workers} in {probe_s:.1f} s (probe batch {probe.probe_batch_size}, "
              f"sample {probe.sample_ms or float('nan'):.2f} ms)\n{probe.format_table()}", flush=True)  # fmt: skip
        sweep: dict[int, dict] = {}
        passes: dict[int, list[float]] = {}
        started = time.perf_counter()
        for rep in range(args.sweep_passes):
            if rep and time.perf_counter() - started > args.repeat_below_s * rep:
                break  # a slow loader: one pass (its windows are long and steady)
            for w in sorted(set(counts) | {probe.num_workers}):
                window = measure_loader(clone_loader(loader, w), w, cap_s=max(60.0, 20 * args.sweep_seconds),
                                        min_window_s=args.sweep_seconds)  # fmt: skip
                passes.setdefault(w, []).append(window.rate * loader.batch_size)
                sweep.setdefault(w, {**window.as_dict(), "passes": []})["passes"].append(window.as_dict())
                print(f"  sweep {w:>2} workers (pass {rep + 1}): {passes[w][-1]:12,.0f} samples/s{window.flag()}",
                      flush=True)  # fmt: skip
        for w, rates in passes.items():  # the median of the passes (interleaved: drift hits every count alike)
            sweep[w]["samples_per_s"] = statistics.median(rates)
            sweep[w]["pass_rates"] = rates
        best = max(sweep, key=lambda w: sweep[w]["samples_per_s"])
        ratio = sweep[probe.num_workers]["samples_per_s"] / sweep[best]["samples_per_s"]
        print(f"{name}: probe's choice {probe.num_workers} = {ratio:.3f} of the sweep's best ({best})", flush=True)
        results[name] = {"batch_size": loader.batch_size, "user_num_workers": loader.num_workers,
                         "probe": probe.as_dict(), "probe_wall_s": probe_s, "sweep": {str(k): v for k, v in sweep.items()},
                         "sweep_best_workers": best, "choice_of_sweep_best": ratio}  # fmt: skip

    figures: dict = {"config": vars(args), "loaders": results}
    if args.train_steps and torch.cuda.is_available():
        figures["training"] = train_vs_hand_tuned(args)
    worst = min(r["choice_of_sweep_best"] for r in results.values())
    slowest = max(r["probe_wall_s"] for r in results.values())
    bars = {
        "probe_of_sweep_best_min": bar(worst, 0.95, "x"),
        "probe_seconds_max": bar(slowest, 30.0, "s", higher_is_better=False),
        "steady_state_halves_max_diff": bar(
            worst_halves_diff([{k: r["sweep"] for k, r in results.items()}, figures.get("training", {})]), 0.05,
            "ratio", higher_is_better=False
        ),
    }
    if "training" in figures:
        bars["train_auto_of_hand_tuned"] = bar(figures["training"]["auto_of_hand_tuned"], 0.95, "x")
    print("\n| loader | batch | yours | probe | probe s | sweep best | choice / best |\n|---|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['batch_size']} | {r['user_num_workers']} | {r['probe']['num_workers']} | "
              f"{r['probe_wall_s']:.1f} | {r['sweep_best_workers']} | {r['choice_of_sweep_best']:.3f} |")  # fmt: skip
    for key, b in bars.items():
        print(f"{key}: {b['value']} (target {b['target']}, pass={b['pass']})")
    print(f"wrote {write_result('auto_num_workers', figures, bars, args.out)}")


def train_vs_hand_tuned(args) -> dict:
    """ResNet-50 from ImageFolderDataModule: num_workers=0 + AutoNumWorkers vs the hand-tuned 16 workers."""
    root = str(demo_tree(args))

    def run(workers: int, callbacks: list) -> dict:
        torch.manual_seed(0)
        meter = ThroughputMeter(warmup=8, steps=args.train_steps)  # ends fit once the window is timed
        trainer = pl.Trainer(
            accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=-(-args.images // args.batch_size),
            callbacks=[meter, StreamPrefetch(normalize=(IMAGENET_MEAN, IMAGENET_STD), channels_last=True),
                       *callbacks],
            logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            num_sanity_val_steps=0, limit_val_batches=0,
        )  # fmt: skip
        dm = ImageFolderDataModule(root, batch_size=args.batch_size, num_workers=workers, pin_memory=True)
        trainer.fit(ImageClassifier("resnet50", num_classes=100, channels_last=True), datamodule=dm)
        return {**meter.summary(), "num_workers": trainer.train_dataloader.num_workers}

    auto = run(0, [AutoNumWorkers(workers_budget_s=args.budget, use_cache=False)])
    hand = run(16, [])
    print(f"training: auto ({auto['num_workers']} workers) {auto['samples_per_s']:,.0f} img/s, hand-tuned (16) "
          f"{hand['samples_per_s']:,.0f} img/s")  # fmt: skip
    return {"auto": auto, "hand_tuned": hand, "auto_of_hand_tuned": auto["samples_per_s"] / hand["samples_per_s"]}


if __name__ == "__main__":
    main()
