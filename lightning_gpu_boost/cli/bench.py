"""Reproduce the headline table on this machine, side by side in one run: ceiling, plain Lightning, hand-tuned
DataLoader, the one-line ``GPUBoost()`` on the plain loader, the boosted CPU path, LMDB, DALI from folder and from
LMDB, on generated demo JPEGs.

Writes ``<out>/bench-<date>-<gpu>.json``, a Markdown table beside it and a bar chart PNG (with matplotlib).
"""

from __future__ import annotations

import argparse
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from lightning_gpu_boost.cli._args import at_least, positive_float, writable_folder

__all__ = ['add_arguments', 'run']


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", default=os.environ.get("LGB_DEMO_DATA", ".demo-data"), help="demo data folder"
    )
    parser.add_argument("--images", type=at_least(1), help="generated JPEGs (default 64,000 on a GPU: 250 batches, so that the queue's drain and the window fit in one epoch; 96 on a CPU)")
    parser.add_argument("--classes", type=at_least(1), help="class folders (default 100 on a GPU, 4 on a CPU)")
    parser.add_argument("--batch-size", type=at_least(1))
    parser.add_argument("--image-size", type=at_least(16), help="pixels per side (at least 16)")
    parser.add_argument("--arch", choices=["small_cnn", "resnet50"])
    parser.add_argument("--steps", type=at_least(1), help="timed steps per case")
    parser.add_argument(
        "--warmup", type=at_least(0), help="the fewest untimed steps (the loader's queue plus a few are skipped anyway)"
    )
    parser.add_argument("--plain-steps", type=at_least(1), help="timed steps of the (slow) plain case")
    parser.add_argument(
        "--workers-budget", dest="workers_budget", type=positive_float, default=20.0,
        help="seconds for each worker-count search",
    )
    parser.add_argument("--out", default="benchmarks/results", help="where the JSON, Markdown and PNG go")
    parser.set_defaults(func=run)


def _config(args: argparse.Namespace, gpu: bool) -> dict[str, Any]:
    cfg: dict[str, Any] = (
        {"arch": "resnet50", "images": 64000, "classes": 100, "batch_size": 256, "image_size": 224, "steps": 64,
         "warmup": 8, "plain_steps": 15}
        if gpu
        else {"arch": "small_cnn", "images": 96, "classes": 4, "batch_size": 16, "image_size": 64, "steps": 4,
              "warmup": 2, "plain_steps": 2}
    )  # fmt: skip
    for key in cfg:
        if getattr(args, key, None) is not None:
            cfg[key] = getattr(args, key)
    return cfg


def run(args: argparse.Namespace) -> int:
    from lightning_gpu_boost._logging import lightning_level

    with lightning_level(logging.WARNING):  # Lightning's INFO lines around the table; as they were after it
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import torch  # here, not at import: a mistyped argument is reported before torch loads
    from torch.utils.data import DataLoader

    from lightning_gpu_boost._imports import module_available
    from lightning_gpu_boost.baselines import plain_image_folder
    from lightning_gpu_boost.callbacks import GPUBoost, StreamPrefetch
    from lightning_gpu_boost.cli.demo import _fit
    from lightning_gpu_boost.core.cpus import usable_cpus
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.results import bar, write_result
    from lightning_gpu_boost.core.steady import ResidentBatches, worst_halves_diff
    from lightning_gpu_boost.datamodules import ImageFolderDataModule
    from lightning_gpu_boost.models import ImageClassifier
    from lightning_gpu_boost.strategies import recommended_precision

    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    gpu = torch.cuda.is_available()
    cfg = _config(args, gpu)
    if cfg["images"] < cfg["classes"]:
        raise SystemExit(f"--images {cfg['images']} is fewer than --classes {cfg['classes']}: each class folder needs "
                         "an image.")  # fmt: skip
    writable_folder("--out", args.out)
    root = make_jpeg_folder(Path(args.data) / f"jpeg-{cfg['images']}-{cfg['classes']}", n=cfg["images"],
                            num_classes=cfg["classes"])  # fmt: skip
    fast = "bf16-mixed" if gpu and torch.cuda.is_bf16_supported() else "32-true"
    size, bs, steps, warmup = cfg["image_size"], cfg["batch_size"], cfg["steps"], cfg["warmup"]
    results: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}

    def model(channels_last: bool = gpu) -> ImageClassifier:
        torch.manual_seed(0)
        return ImageClassifier(cfg["arch"], cfg["classes"], channels_last=channels_last)

    def case(name: str, data: Any, precision: str, timed: int, channels_last: bool = gpu,
             callbacks: tuple = ()) -> None:  # fmt: skip
        print(f"bench: {name} ...", flush=True)
        fit = _fit(model(channels_last), data, precision, timed, warmup, callbacks)
        results[name] = {**fit, "precision": precision}
        probes = getattr(data, "auto_probes", None)  # num_workers="auto": what the probe chose
        if probes:
            results[name]["num_workers"] = {stage: probe.num_workers for stage, probe in probes.items()}
        if hasattr(data, "decoder_in_use"):  # DALIDataModule: where "auto" decoded
            results[name]["decoder"] = data.decoder_in_use
        print(f"bench: {name}: {results[name]['samples_per_s']:,.0f} img/s", flush=True)

    device = torch.device("cuda" if gpu else "cpu")
    batch = (torch.randint(0, 256, (bs, 3, size, size), dtype=torch.uint8, device=device),
             torch.randint(0, cfg["classes"], (bs,), device=device))  # fmt: skip
    # epochs as long as the loaders' (same number of batches), so that the ceiling pays Lightning's epoch boundaries
    case("ceiling", ResidentBatches(batch, -(-cfg["images"] // bs)), fast, steps)
    del batch
    plain = DataLoader(plain_image_folder(root, size), batch_size=bs, shuffle=True)
    case("plain", plain, "32-true", cfg["plain_steps"], channels_last=False)
    workers = usable_cpus()
    tuned = DataLoader(plain_image_folder(root, size), batch_size=bs, shuffle=True, num_workers=workers,
                       pin_memory=gpu, persistent_workers=True, prefetch_factor=4)  # fmt: skip
    case("hand_tuned", tuned, fast, steps)
    del tuned
    # the one-line change: the plain loader as written, with GPUBoost() and recommended_precision()
    one_line = DataLoader(plain_image_folder(root, size), batch_size=bs, shuffle=True)
    case("gpu_boost", one_line, recommended_precision(), steps, channels_last=False,
         callbacks=(GPUBoost(workers_budget_s=args.workers_budget),))  # fmt: skip
    del one_line
    boosted = dict(
        image_size=size, batch_size=bs, num_workers="auto", workers_budget_s=args.workers_budget
    )
    case("boosted_cpu", ImageFolderDataModule(str(root), **boosted), fast, steps, callbacks=(StreamPrefetch(),))
    pack = None
    if module_available("lmdb"):
        from lightning_gpu_boost.core.lmdb import pack_image_folder
        from lightning_gpu_boost.datamodules.lmdb import LMDBDataModule

        pack = Path(f"{root}.lmdb")
        if not pack.exists():
            pack_image_folder(root, pack, progress=False)
        case("lmdb", LMDBDataModule(str(pack), **boosted), fast, steps, callbacks=(StreamPrefetch(),))
    else:
        skipped["lmdb"] = "lmdb is not installed (pip install 'lightning-gpu-boost[lmdb]')"
    if module_available("nvidia.dali"):
        from lightning_gpu_boost.datamodules.dali import DALIDataModule

        dali = dict(batch_size=bs, image_size=size, dtype="bfloat16" if fast == "bf16-mixed" else "float32",
                    channels_last=gpu)  # fmt: skip
        case("dali_folder", DALIDataModule(str(root), **dali), fast, steps)
        if pack is not None:
            case("dali_lmdb", DALIDataModule(str(pack), **dali), fast, steps)
    else:
        skipped["dali"] = "DALI is not installed (the extra `dali`, or `dali-cuda13` for CUDA 13 torch)"

    rate = {name: r["samples_per_s"] for name, r in results.items()}
    for name, r in results.items():
        r["of_ceiling"] = rate[name] / rate["ceiling"]
        r["vs_plain"] = rate[name] / rate["plain"]
    boosted_best = max(v for k, v in rate.items() if k not in ("ceiling", "plain", "hand_tuned"))
    bars = {
        "boosted_cpu_vs_hand_tuned": bar(rate["boosted_cpu"] / rate["hand_tuned"], 1.2, "x"),
        "boosted_best_vs_plain": bar(boosted_best / rate["plain"], 10.0, "x"),
        "gpu_boost_vs_plain": bar(rate["gpu_boost"] / rate["plain"], 10.0, "x"),
    }
    if "dali_folder" in rate:
        bars["dali_folder_of_ceiling"] = bar(results["dali_folder"]["of_ceiling"], 0.95, "ratio")
    if "dali_lmdb" in rate:
        bars["dali_lmdb_of_ceiling"] = bar(results["dali_lmdb"]["of_ceiling"], 0.90, "ratio")
    # every case is ThroughputMeter's steady window: the worst halves difference says whether all were steady
    bars["steady_state_halves_max_diff"] = bar(worst_halves_diff(results), 0.05, "ratio", higher_is_better=False)
    if gpu:
        print("\n| case | img/s | of ceiling | vs plain |\n|---|---|---|---|")
    else:  # the "ceiling" shares the CPUs with nothing, the others share them with their loaders: no ratio holds
        print("\nNo CUDA GPU: these figures are not meaningful for what the package does (it keeps a GPU fed; here the "
              "step and the loaders share the same CPUs), and no case is compared with the ceiling. Run `bench` on a "
              "GPU machine for the table the docs quote.")  # fmt: skip
        print("\n| case | img/s | vs plain |\n|---|---|---|")
    for name, r in results.items():
        if name == "ceiling" and not gpu:
            continue
        flag = "" if r.get("steady", True) else f" (not steady: halves {100 * r['halves_diff']:.0f} % apart)"
        ceiling = f" {100 * r['of_ceiling']:.0f} % |" if gpu else ""
        print(f"| {name} | {rate[name]:,.0f}{flag} |{ceiling} {r['vs_plain']:.1f}x |")
    for name, why in skipped.items():
        print(f"(skipped {name}: {why})")
    figures = {"config": cfg, "usable_cpus": usable_cpus(), "cases": results, "skipped": skipped}
    path = write_result("bench", figures, bars, args.out)
    print(f"wrote {path}")
    if module_available("matplotlib"):
        _chart(results, path.with_suffix(".png"))
        print(f"wrote {path.with_suffix('.png')}")
    return 0


def _chart(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    names = list(results)
    values = [results[n]["samples_per_s"] for n in names]
    fig = Figure(figsize=(8, 3.5))
    ax = fig.add_subplot()
    bars = ax.barh(names[::-1], values[::-1], color="#4c72b0")
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values[::-1]], padding=3)
    ax.set_xlim(0, 1.15 * max(values))
    ax.set_xlabel("training images/s")
    ax.set_title("lightning-gpu-boost bench")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
