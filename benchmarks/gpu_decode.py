"""GPU decode, placed by measurement (issue 63), side by side in one run on the GPU machine.

    python benchmarks/gpu_decode.py --parts decoders,resnet50 --out /tmp/r1
    python benchmarks/gpu_decode.py --parts resnet50_4cpus,resnet18 --out /tmp/r2
    python benchmarks/gpu_decode.py --merge /tmp/r1/part.json /tmp/r2/part.json   # the result file, with bars

The bench's 64,000-JPEG tree (100 classes, 400-560 x 320-440 px) read by the user's loader as Lightning's ImageNet
example writes it: torchvision ``ImageFolder`` with ``RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
Normalize``, ``DataLoader(batch_size=256, shuffle=True)``; bf16, channels_last, batch 256. Cases per model: the
resident ceiling (the same batches in GPU memory), the one line ``GPUBoost()`` with ``decode="cpu"``, ``"gpu"`` and
``"auto"`` (its default). ``resnet50_4cpus``: the same ResNet-50 cases with the process held to 5 CPUs (the
training process and 4 for the workers). ``decoders``: each decoder alone (nvJPEG through the package's
``BatchDecoder``, with crop, resize, flip and normalize; the CPU path per core, times the usable CPUs).

Steady state (``core/steady.py``, ``docs/method.md``): ThroughputMeter times ``--steps`` steps after the warm-up and
the loader's queue; the ``auto`` cases warm up through the placement's measurement first (``--auto-warmup``).
CPU cores used: the process's and its workers' CPU time over the fit's wall time; per 1,000 img/s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _common import demo_tree, parser_for

from lightning_gpu_boost.core.results import bar, write_result

CASES = ("cpu", "gpu", "auto")


def _cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def fit_case(root: Path, arch: str, decode: str | None, args: argparse.Namespace) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.baselines import plain_image_folder
    from lightning_gpu_boost.callbacks import GPUBoost
    from lightning_gpu_boost.core.steady import ResidentBatches
    from lightning_gpu_boost.doctor import measure_fit
    from lightning_gpu_boost.models import ImageClassifier

    torch.manual_seed(0)
    model = ImageClassifier(arch, 100, channels_last=True)
    bs = args.batch_size
    if decode is None:  # the resident ceiling: the same batches, in GPU memory
        batch = (torch.randint(0, 256, (bs, 3, 224, 224), dtype=torch.uint8, device="cuda"),
                 torch.randint(0, 100, (bs,), device="cuda"))  # fmt: skip
        return measure_fit(model, ResidentBatches(batch, -(-args.images // bs)), args.steps, args.warmup,
                           precision="bf16-mixed")  # fmt: skip
    loader = DataLoader(plain_image_folder(root, 224), batch_size=bs, shuffle=True)  # the user's loader, as written
    boost = GPUBoost(decode=decode, workers_budget_s=args.workers_budget)
    cpu0, wall0 = _cpu_seconds(), time.perf_counter()
    warmup = args.auto_warmup if decode == "auto" else args.warmup
    result = measure_fit(model, loader, args.steps, warmup, (boost,), precision="bf16-mixed")
    wall = time.perf_counter() - wall0
    result["cpu_cores_used"] = (_cpu_seconds() - cpu0) / wall
    result["cpu_cores_per_1000_img_s"] = result["cpu_cores_used"] / (result["samples_per_s"] / 1000)
    result["num_workers"] = boost.parts["auto_workers"].chosen.get("train")
    result["decode"] = boost.parts["prefetch"].decode_placement
    return result


def model_part(root: Path, arch: str, args: argparse.Namespace, cpus: int | None = None) -> dict[str, Any]:
    everyone = sorted(os.sched_getaffinity(0))
    if cpus is not None:
        os.sched_setaffinity(0, everyone[: cpus + 1])  # the training process and `cpus` for the workers
    try:
        cases: dict[str, Any] = {}
        if cpus is None and args.ceiling:
            cases["ceiling"] = fit_case(root, arch, None, args)
            print(f"{arch}: ceiling {cases['ceiling']['samples_per_s']:,.0f} img/s", flush=True)
        for decode in args.cases.split(","):
            cases[decode] = fit_case(root, arch, decode, args)
            print(f"{arch} ({cpus or 'all'} CPUs): decode={decode} {cases[decode]['samples_per_s']:,.0f} img/s "
                  f"({cases[decode]['decode']})", flush=True)  # fmt: skip
        return {"arch": arch, "worker_cpus": cpus or len(everyone), "cases": cases}
    finally:
        os.sched_setaffinity(0, everyone)


def decoders(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Each decoder alone on the tree's first files: nvJPEG with the GPU steps, and the CPU path per core."""
    from PIL import Image

    from lightning_gpu_boost.baselines import plain_image_folder
    from lightning_gpu_boost.core.cpus import usable_cpus
    from lightning_gpu_boost.core.gpu_decode import BatchDecoder, Share, take_over

    dataset = plain_image_folder(root, 224)
    paths = [p for p, _ in dataset.samples[:: max(1, len(dataset.samples) // 2048)][:2048]]
    t0 = time.perf_counter()
    for p in paths[:400]:  # the CPU path: decode, random-resized crop, flip, ToTensor, Normalize
        dataset.transform(Image.open(p).convert("RGB"))
    cpu_per_core = 400 / (time.perf_counter() - t0)
    take_over(dataset, Share(1.0))
    records = [dataset[i * max(1, len(dataset) // 2048)][0] for i in range(2048)]
    from torch.utils.data import default_collate
    decoder = BatchDecoder((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), device="cuda", dtype="bfloat16")
    bs = args.batch_size

    def timed(fn) -> tuple[float, float]:
        """img/s of ``fn(batch of records)`` over the records, and this thread's CPU seconds per batch."""
        for k in range(2):
            fn(default_collate(records[k * bs: (k + 1) * bs]))
        torch.cuda.synchronize()
        t0, c0, n = time.perf_counter(), time.thread_time(), 0
        for k in range(len(records) // bs):
            fn(default_collate(records[k * bs: (k + 1) * bs]))
            n += 1
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        return n * bs / wall, (time.thread_time() - c0) / n

    from torchvision.io import ImageReadMode, decode_jpeg

    def nvjpeg_alone(batch):
        decode_jpeg(batch.jpegs(), device="cuda", mode=ImageReadMode.RGB)

    alone, alone_cpu = timed(nvjpeg_alone)
    full, full_cpu = timed(decoder.images)
    return {"cpu_path_img_s_per_core": cpu_per_core, "usable_cpus": usable_cpus(),
            "cpu_path_img_s_host": cpu_per_core * usable_cpus(), "nvjpeg_alone_img_s": alone,
            "nvjpeg_alone_thread_cpu_s_per_batch": alone_cpu, "gpu_path_img_s": full,
            "gpu_path_thread_cpu_s_per_batch": full_cpu,
            "hardware_engines": "not measured: nvImageCodec is not installed on the device"}  # fmt: skip


def merge(parts: list[str], out: str) -> Path:
    """One result file from part files (each one call of the machine): a later file's part replaces an earlier
    one's; every ratio is taken inside one run (a part's ceiling is its own run's ResNet-50 or ResNet-18 ceiling),
    and each part names its run."""
    figures: dict[str, Any] = {"parts": {}, "runs": []}
    for path in parts:
        found = json.loads(Path(path).read_text())
        run = {**found["run"], "config": found["config"], "file": Path(path).name}
        figures["runs"].append(run)
        for name, part in found["parts"].items():
            arch = part.get("arch")
            base = found["parts"].get(arch, {}).get("cases", {}).get("ceiling") if arch else None
            figures["parts"][name] = {**part, "run": len(figures["runs"]) - 1,
                                      "ceiling_samples_per_s": base["samples_per_s"] if base else None}  # fmt: skip
    bars: dict[str, Any] = {}
    p = figures["parts"]
    for name, part in p.items():
        if "cases" not in part:
            continue
        for r in part["cases"].values():
            if part["ceiling_samples_per_s"]:
                r["of_ceiling"] = r["samples_per_s"] / part["ceiling_samples_per_s"]
        if "auto" in part["cases"] and "cpu" in part["cases"]:
            part["auto_vs_cpu"] = part["cases"]["auto"]["samples_per_s"] / part["cases"]["cpu"]["samples_per_s"]
            bars[f"{name}_auto_vs_cpu_decode"] = bar(part["auto_vs_cpu"], 0.98, "x")
        if "auto" in part["cases"] and part["ceiling_samples_per_s"]:
            target = {"resnet50": 0.97, "resnet18": 0.80, "resnet50_4cpus": 0.90}[name]
            bars[f"{name}_one_line_of_ceiling"] = bar(part["cases"]["auto"]["of_ceiling"], target, "ratio")
    halves = [c.get("halves_diff", 0.0) for part in p.values() for c in part.get("cases", {}).values()]
    bars["steady_state_halves_max_diff"] = bar(max(halves), 0.05, "ratio", higher_is_better=False)
    # the machine that measured: the last run's environment (each run keeps its own in figures.runs)
    env = {**figures["runs"][-1]["environment"], "merged_from": [r["file"] for r in figures["runs"]]}
    gpus = env.get("gpu_count") or 1
    return write_result("gpu_decode", figures, bars, out, env=env, tag=f"{gpus}xh200" if gpus > 1 else "h200")


def main() -> int:
    parser = parser_for(__doc__)  # --data, --images, --batch-size, --out
    parser.set_defaults(images=64000)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--auto-warmup", type=int, default=200, help="untimed steps of the auto cases")
    parser.add_argument("--workers-budget", type=float, default=10.0, help="AutoNumWorkers' probe budget (5 s "
                        "could not rank the counts of the GPU decode's cheap workers: it kept 0)")
    parser.add_argument("--parts", default="decoders,resnet50,resnet50_4cpus,resnet18")
    parser.add_argument("--cases", default=",".join(CASES), help="decode settings to run, of cpu,gpu,auto")
    parser.add_argument("--no-ceiling", dest="ceiling", action="store_false", help="leave the ceiling out")
    parser.add_argument("--merge", nargs="+", help="part files to merge into the result file")
    args = parser.parse_args()
    if args.merge:
        print(f"wrote {merge(args.merge, args.out)}")
        return 0
    t0 = time.perf_counter()
    root = demo_tree(args)
    from lightning_gpu_boost.core.results import environment

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = {k: getattr(args, k) for k in ("images", "batch_size", "steps", "warmup", "auto_warmup")}
    parts: dict[str, Any] = {}
    for part in args.parts.split(","):
        if part == "decoders":
            parts[part] = decoders(root, args)
            print(f"decoders: {parts[part]}", flush=True)
        elif part == "resnet50_4cpus":
            parts[part] = model_part(root, "resnet50", args, cpus=4)
        elif part in ("resnet50", "resnet18"):
            parts[part] = model_part(root, part, args)
        else:
            raise SystemExit(f"--parts: unknown part {part!r}")
        # after each part: a call cut short by its time limit keeps the parts it finished
        run = {"parts": list(parts), "seconds": time.perf_counter() - t0, "environment": environment(),
               "command": " ".join(sys.argv)}  # fmt: skip
        (out / "part.json").write_text(json.dumps({"parts": parts, "config": config, "run": run}, indent=2))
        print(f"wrote {out / 'part.json'} after {run['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
