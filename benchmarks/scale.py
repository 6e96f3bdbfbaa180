"""One GPU vs several: the ceiling, the boosted CPU path, LMDBDataModule and DALIDataModule (folder and LMDB), and
torchvision's ``ImageFolder`` loader with ``GPUBoost`` (``gpu_decode``: ``decode="gpu"``; ``one_line``: its default),
every configuration in one run, ResNet-50 bf16 on the generated demo JPEGs.

    python benchmarks/scale.py --data /tmp/demo                 # the 2 x H200 machine: 1 GPU vs 2
    python benchmarks/scale.py --size cpu --data /tmp/scale     # a smoke run: 1 vs 2 gloo processes on CPU
    python benchmarks/scale.py --only ceiling --devices 4 --independent   # 4 one-GPU processes at once, no DDP
    python benchmarks/scale.py --only ceiling --bucket-cap-mb 100 --nccl-channels 8   # what DDP costs, tuned

Each configuration runs in its own process, and Lightning launches the ranks (``strategy="ddp_boost"`` on several
devices); every rank times its own steady window (``ThroughputMeter``: the loader's queue skipped, halves compared,
inside one epoch where an epoch holds it; the fit ends once every rank's window is timed) and writes it; the node's rate is the sum over ranks. The DataModules pick their workers with
``num_workers="auto"``, which divides the node's usable CPUs among its local ranks; DALI divides its threads the
same way. The ceiling is each rank's batch resident on its GPU (no loader), with the same strategy.

Bars (``scale-<date>-<gpu>.json``): DALIDataModule from the folder on N GPUs >= 1.9x its one-GPU figure and >= 95 %
of the N-GPU ceiling; the boosted CPU path and LMDBDataModule >= 1.8x; ``ddp_boost`` on resident batches >= 1.93x;
per GPU with ``GPUBoost`` on torchvision's loader >= 0.95x one GPU's; every window steady (halves <= 5 % apart).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # the checkout, for `python benchmarks/scale.py`

CASES = ("ceiling", "boosted_cpu", "lmdb", "dali_folder", "dali_lmdb", "gpu_decode", "one_line")


def _config(args: argparse.Namespace) -> dict:
    gpu = args.size == "gpu"
    cfg = (
        {"arch": "resnet50", "images": 64000, "classes": 100, "batch_size": 256, "image_size": 224, "steps": 64,
         "warmup": 8}
        if gpu
        else {"arch": "small_cnn", "images": 256, "classes": 4, "batch_size": 8, "image_size": 64, "steps": 6,
              "warmup": 2}
    )  # fmt: skip
    for key in ("images", "steps", "batch_size"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    return cfg


def _roots(args: argparse.Namespace, cfg: dict) -> tuple[Path, Path]:
    root = Path(args.data) / f"jpeg-{cfg['images']}-{cfg['classes']}"
    return root, Path(f"{root}.lmdb")


def _strategy(args: argparse.Namespace) -> object:
    """The several-device strategy: its name, or ``ddp_boost`` with ``--bucket-cap-mb``."""
    if args.bucket_cap_mb is None:
        return args.strategy
    if args.strategy != "ddp_boost":
        raise SystemExit(f"--bucket-cap-mb goes with --strategy ddp_boost, not {args.strategy!r}")
    from lightning_gpu_boost.strategies import DDPBoostStrategy

    return DDPBoostStrategy(bucket_cap_mb=args.bucket_cap_mb)


def child(args: argparse.Namespace) -> None:
    """One configuration (``args.run`` on ``args.devices`` devices); every rank writes its meter's summary."""
    import lightning.pytorch as pl
    import torch

    import lightning_gpu_boost  # noqa: F401  (registers ddp_boost)
    from lightning_gpu_boost.callbacks.throughput_meter import MAX_EXTENSION, ThroughputMeter
    from lightning_gpu_boost.core.steady import EXTRA_WARMUP, ResidentBatches, min_warmup
    from lightning_gpu_boost.doctor import queue_bound
    from lightning_gpu_boost.models import ImageClassifier

    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    cfg = _config(args)
    gpu = args.size == "gpu"
    root, pack = _roots(args, cfg)
    bs, size = cfg["batch_size"], cfg["image_size"]
    boosted = dict(
        image_size=size, batch_size=bs, num_workers="auto", workers_budget_s=args.workers_budget
    )
    callbacks: list = []
    warmup = cfg["warmup"]
    if args.run == "ceiling":
        # this rank's batch on its own GPU (Lightning's launcher starts each rank with LOCAL_RANK set; rank 0 has
        # none before fit), one epoch as long as the loaders' epochs per rank
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else torch.device("cpu")
        g = torch.Generator(device=device).manual_seed(0)
        batch = (torch.randint(0, 256, (bs, 3, size, size), dtype=torch.uint8, device=device, generator=g),
                 torch.randint(0, cfg["classes"], (bs,), device=device, generator=g))  # fmt: skip
        data = ResidentBatches(batch, -(-cfg["images"] // (bs * args.devices)))
    elif args.run in ("gpu_decode", "one_line"):
        # the user's torchvision loader as written, GPUBoost deciding the rest: decode="gpu" forced, or its default
        from torch.utils.data import DataLoader

        from lightning_gpu_boost.baselines import plain_image_folder
        from lightning_gpu_boost.callbacks import GPUBoost

        data = DataLoader(plain_image_folder(root, size), batch_size=bs, shuffle=True)
        boost = GPUBoost(decode="gpu" if args.run == "gpu_decode" else "auto", workers_budget_s=args.workers_budget)
        callbacks.append(boost)
        if args.run == "one_line":  # the window opens once the placement is decided (rank 0's, broadcast)
            from gpu_decode_probes import OpenAfterPlacement

            callbacks.append(OpenAfterPlacement(boost))
            warmup = args.auto_warmup
            _time_search_steps()
    elif args.run == "boosted_cpu":
        from lightning_gpu_boost.datamodules import ImageFolderDataModule

        data = ImageFolderDataModule(str(root), **boosted)
    elif args.run == "lmdb":
        from lightning_gpu_boost.datamodules.lmdb import LMDBDataModule

        data = LMDBDataModule(str(pack), **boosted)
    else:
        from lightning_gpu_boost.datamodules.dali import DALIDataModule

        data = DALIDataModule(str(root if args.run == "dali_folder" else pack), batch_size=bs, image_size=size,
                              dtype="bfloat16" if gpu else "float32", channels_last=gpu,
                              **({} if gpu else {"device": "cpu"}))  # fmt: skip
    queue = queue_bound(data, args.devices)  # each rank's workers get its share of the node's CPUs
    if callbacks:  # GPUBoost picks the workers (its share of the node's CPUs) and decodes 3 batches ahead
        from lightning_gpu_boost.doctor.measure import tuned_queue_bound

        queue = tuned_queue_bound(args.devices) + 3
    # each rank's window inside one epoch where an epoch holds it (docs/method.md, rule 5): the meter times `steps`,
    # and the fit ends once every rank's meter would end it
    meter = ThroughputMeter(warmup=warmup, steps=cfg["steps"], sample_gpu_util=False)
    per_rank = -(-cfg["images"] // (bs * args.devices))
    torch.backends.cudnn.benchmark = gpu
    trainer = pl.Trainer(
        accelerator="gpu" if gpu else "cpu", devices=args.devices,
        strategy=_strategy(args) if args.devices > 1 else "auto", precision="bf16-mixed" if gpu else "32-true",
        max_steps=min_warmup(queue, warmup) + 2 * queue + EXTRA_WARMUP + MAX_EXTENSION * cfg["steps"] + per_rank,
        callbacks=[meter, *callbacks, _every_rank_stops()], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = ImageClassifier(cfg["arch"], cfg["classes"], channels_last=gpu)
    if isinstance(data, pl.LightningDataModule):
        trainer.fit(model, datamodule=data)
    else:
        trainer.fit(model, data)
    summary = meter.summary()
    summary["world_size"] = trainer.world_size
    per_epoch, start = trainer.num_training_batches, summary.get("warmup_steps", 0)
    if isinstance(per_epoch, int) and per_epoch > 0 and summary.get("steps"):  # docs/method.md, rule 5
        summary["window_in_one_epoch"] = start // per_epoch == (start + summary["steps"] - 1) // per_epoch
    summary["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30 if gpu else None
    probes = getattr(data, "auto_probes", None)
    if probes:
        summary["num_workers"] = {stage: probe.num_workers for stage, probe in probes.items()}
    if hasattr(data, "decoder_in_use"):
        summary["decoder"] = data.decoder_in_use
    if args.run in ("gpu_decode", "one_line"):  # the placement, with the search's windows and its steps' times
        summary["decode"] = {**(boost.parts["prefetch"].decode_placement or {}),
                             **{k: _spread(v) for k, v in _SEARCH_STEPS.items() if v}}  # fmt: skip
    out = Path(args.rank_dir, f"{args.run}-{args.devices}-{args.tag}rank{trainer.global_rank}.json")
    out.write_text(json.dumps(summary, default=str))
    if _SEARCH_TRACE:  # beside the rank's summary, not in the result (a row per step)
        Path(args.rank_dir, "trace").mkdir(exist_ok=True)
        Path(args.rank_dir, "trace", out.name).write_text(json.dumps(_SEARCH_TRACE))


def _every_rank_stops(every: int = 8) -> object:
    """A callback after the meter: the fit stops once every rank's meter would stop it. A rank's wish is held (a rank
    stopping alone would leave the others waiting) and the ranks agree every ``every`` steps and at an epoch's last
    batch through a gloo group (host tensors: no wait for the GPU, where the strategy's ``reduce_boolean_decision``
    reads a CUDA tensor back at every step). Built here, as Lightning is imported in the ranks."""
    import lightning.pytorch as pl
    import torch
    import torch.distributed as dist

    class EveryRankStops(pl.Callback):
        def __init__(self) -> None:
            self.wish, self.group = False, None

        def on_train_start(self, trainer, *args) -> None:  # every rank: new_group is collective
            if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
                self.group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.wish, trainer.should_stop = self.wish or trainer.should_stop, False
            if self.group is None:  # one process
                trainer.should_stop = self.wish
            elif trainer.global_step % every == 0 or batch_idx + 1 >= trainer.num_training_batches:  # and at an
                # epoch's last batch, where a meter stops rather than time across the epoch's end
                agreed = torch.tensor([1.0 if self.wish else 0.0])
                dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=self.group)
                trainer.should_stop = bool(agreed.item())

        def on_train_end(self, trainer, *args) -> None:
            if self.group is not None and self.group is not dist.group.WORLD:
                dist.destroy_process_group(self.group)
            self.group = None

    return EveryRankStops()


_SEARCH_STEPS: dict[str, list[float]] = {"search_step_ms": [], "search_interval_ms": []}
#: one_line: each search step's [the ranks' shares as gathered (None: one process), step, this rank's batch share,
#: batches in a row showing the share, timed, still to skip, settle, breaks, the share measured]
_SEARCH_TRACE: list[list] = []


def _spread(values: list[float]) -> dict[str, float]:
    """How many, and their median, 90th percentile and largest (the result's table stays short)."""
    ordered = sorted(values)
    return {"n": len(ordered), "median": ordered[len(ordered) // 2], "p90": ordered[int(0.9 * (len(ordered) - 1))],
            "max": ordered[-1]}


def _time_search_steps() -> None:
    """one_line: each step of the placement search timed (under DDP it gathers every rank's last batch through
    gloo), and the time between the steps (what the search's windows read), kept in the rank's summary; each step's
    figures (``_SEARCH_TRACE``) go beside it, under ``trace/``."""
    import time

    import lightning_gpu_boost.callbacks._gpu_decode as adapter
    from lightning_gpu_boost.callbacks._gpu_decode import GPUDecodeStage

    original, last, agreed, shares = GPUDecodeStage._search_step, [None], adapter.agreed, [None]

    def gathered(rows, tolerance):  # under DDP: each rank's share as gathered, before the ranks' figures are agreed
        shares[0] = [row[1] for row in rows]
        return agreed(rows, tolerance)

    def timed(self, trainer, timer=None):
        t0 = time.perf_counter()
        if last[0] is not None:
            _SEARCH_STEPS["search_interval_ms"].append(1e3 * (t0 - last[0]))
        try:
            return original(self, trainer, timer)
        finally:
            last[0] = time.perf_counter()
            _SEARCH_STEPS["search_step_ms"].append(1e3 * (last[0] - t0))
            s = timer or self.search  # the split search, or the decoder's choice after it
            _SEARCH_TRACE.append([shares[0], trainer.global_step, self._last_batch()[0], s._shown, s._n, s._skip,
                                  s.settle, s._breaks, s.todo[0] if s.todo else None])  # fmt: skip
            shares[0] = None

    adapter.agreed = gathered
    GPUDecodeStage._search_step = timed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=["cpu", "gpu"], help="gpu where CUDA is available, else cpu")
    parser.add_argument(
        "--data", default=".demo-data", help="folder of the generated demo JPEGs (and their LMDB)"
    )
    parser.add_argument("--devices", type=int, default=2, help="the several-GPU figure's devices")
    parser.add_argument("--images", type=int, help="generated JPEGs (default 64,000 on GPUs, 256 on CPU)")
    parser.add_argument("--batch-size", type=int, help="per device")
    parser.add_argument("--steps", type=int, help="timed steps per configuration (after the queue)")
    parser.add_argument("--only", nargs="+", choices=CASES, help="cases to run (default: all)")
    parser.add_argument(
        "--keep",
        help="an earlier scale result (JSON): its cases that --only does not re-run are carried over, each with "
        "the commit it was measured at",
    )
    parser.add_argument(
        "--workers-budget", type=float, default=10.0, help="seconds for each worker-count search"
    )
    parser.add_argument(
        "--strategy", default="ddp_boost", help="the several-device strategy (ddp, ddp_boost, ddp_boost_bf16, ...)"
    )
    parser.add_argument("--auto-warmup", type=int, help="one_line: the most steps before its window opens (it opens "
                        "once the decode's placement is decided: the fit runs this many more steps; default 1300 on "
                        "GPUs, where the 2 x H200 search decided at step 980 with 125-batch epochs, 400 on CPU)")
    parser.add_argument("--bucket-cap-mb", type=float, help="ddp_boost's gradient buckets (MiB; its default 25)")
    parser.add_argument("--nccl-channels", type=int, help="NCCL_MAX_NCHANNELS for every rank: fewer channels take "
                        "fewer SMs from the step while gradients are all-reduced (NCCL's default where unset)")
    parser.add_argument("--out", default="benchmarks/results", help="where the JSON and Markdown results go")
    parser.add_argument(
        "--independent", action="store_true",
        help="the several-device figure from that many one-GPU processes at once, without DDP (each its own GPU): "
        "what the host gives its GPUs working together, apart from what DDP costs",
    )
    parser.add_argument("--run", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="", help=argparse.SUPPRESS)
    parser.add_argument("--rank-dir", default="/tmp/scale-bench", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.size is None:
        import torch

        args.size = "gpu" if torch.cuda.is_available() else "cpu"
    if args.auto_warmup is None:
        args.auto_warmup = 1300 if args.size == "gpu" else 400
    if args.run:
        return child(args)

    from _common import carried_over

    from lightning_gpu_boost._imports import module_available
    from lightning_gpu_boost.core.cpus import usable_cpus
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.results import bar, environment, write_result
    from lightning_gpu_boost.core.steady import worst_halves_diff

    cfg = _config(args)
    root, pack = _roots(args, cfg)
    if args.nccl_channels is not None:  # the children (and Lightning's ranks) inherit it
        os.environ["NCCL_MAX_NCHANNELS"] = str(args.nccl_channels)
    skipped: dict[str, str] = {}
    cases = [c for c in CASES if not args.only or c in args.only]
    if set(cases) - {"ceiling"}:  # the resident ceiling reads no files
        make_jpeg_folder(root, n=cfg["images"], num_classes=cfg["classes"])
    if module_available("lmdb"):
        if not pack.exists() and {"lmdb", "dali_lmdb"} & set(cases):
            from lightning_gpu_boost.core.lmdb import pack_image_folder

            pack_image_folder(root, pack, progress=False)
    else:
        skipped.update({c: "lmdb is not installed" for c in ("lmdb", "dali_lmdb")})
    if not module_available("nvidia.dali"):
        skipped.update({c: "DALI is not installed" for c in ("dali_folder", "dali_lmdb")})
    cases = [c for c in cases if c not in skipped]
    os.makedirs(args.rank_dir, exist_ok=True)
    commit = environment().get("git_commit")
    results: dict[str, dict] = {}
    if args.keep:  # put back in CASES order below
        results.update(carried_over(args.keep, [c for c in CASES if c not in cases], section="cases"))
    for name in cases:
        results[name] = {"git_commit": commit}
        for devices in (1, args.devices):
            for old in Path(args.rank_dir).glob(f"{name}-*.json"):
                old.unlink()
            alone = args.independent and devices > 1  # N one-GPU processes at once
            cmd = [sys.executable, __file__, "--run", name, "--size", args.size, "--devices", "1" if alone else str(devices),
                   "--data", args.data, "--rank-dir", args.rank_dir, "--strategy", args.strategy, "--workers-budget", str(args.workers_budget), "--auto-warmup", str(args.auto_warmup),
                   *(["--bucket-cap-mb", str(args.bucket_cap_mb)] if args.bucket_cap_mb is not None else []),
                   *sum(([f"--{k.replace('_', '-')}", str(getattr(args, k))] for k in ("images", "steps", "batch_size")
                         if getattr(args, k) is not None), [])]  # fmt: skip
            print(f"scale: {name} on {devices}{' (independent processes)' if alone else ''} ...", flush=True)
            if alone:
                procs = [subprocess.Popen([*cmd, "--tag", f"gpu{i}-"], env={**os.environ, "CUDA_VISIBLE_DEVICES": str(i)}
                                          if args.size == "gpu" else None) for i in range(devices)]  # fmt: skip
                if any(p.wait() for p in procs):
                    raise SystemExit(f"scale: an independent {name} process failed")
            else:
                subprocess.run(cmd, check=True)
            ranks = [json.loads(p.read_text()) for p in sorted(Path(args.rank_dir).glob(f"{name}-*.json"))]
            results[name][str(devices)] = {
                "img_s": sum(r["samples_per_s"] for r in ranks),
                "step_ms": max(r["step_ms"] for r in ranks),
                "steady": all(r.get("steady", True) for r in ranks),
                "window_in_one_epoch": all(r.get("window_in_one_epoch", True) for r in ranks),
                "ranks": ranks,
            }  # fmt: skip
            print(
                f"scale: {name} on {devices}: {results[name][str(devices)]['img_s']:,.0f} img/s", flush=True
            )
        one, many = results[name]["1"]["img_s"], results[name][str(args.devices)]["img_s"]
        results[name]["scaling"] = many / one
    results = {c: results[c] for c in CASES if c in results}
    n = str(args.devices)
    for r in results.values():
        if "ceiling" in results:
            r["of_ceiling"] = {d: r[d]["img_s"] / results["ceiling"][d]["img_s"] for d in ("1", n)}
    bars = {}
    if "dali_folder" in results:
        bars["dali_folder_scaling"] = bar(results["dali_folder"]["scaling"], 0.95 * args.devices, "x")
        if "ceiling" in results:
            bars["dali_folder_of_ceiling_many"] = bar(results["dali_folder"]["of_ceiling"][n], 0.95, "ratio")
    for name in ("boosted_cpu", "lmdb"):
        if name in results:
            bars[f"{name}_scaling"] = bar(results[name]["scaling"], 0.9 * args.devices, "x")
    for name in ("gpu_decode", "one_line"):  # per GPU on N against one GPU of the same host
        if name in results:
            bars[f"{name}_per_gpu_of_one"] = bar(results[name]["scaling"] / args.devices, 0.95, "ratio")
    if "ceiling" in results:
        key = "independent_resident_scaling" if args.independent else f"{args.strategy}_resident_scaling"
        bars[key] = bar(results["ceiling"]["scaling"], 0.965 * args.devices, "x")
    bars["steady_state_halves_max_diff"] = bar(
        worst_halves_diff({f"{c}-{d}": results[c][d]["ranks"] for c in results for d in ("1", n)}), 0.05, "ratio",
        higher_is_better=False,
    )  # fmt: skip
    print(
        f"\n| case | 1 device img/s | {n} devices img/s | scaling | of the {n}-device ceiling |\n|---|---|---|---|---|"
    )
    for name, r in results.items():
        flag = "" if r["1"]["steady"] and r[n]["steady"] else " (not steady)"
        flag += "" if r["1"]["window_in_one_epoch"] and r[n]["window_in_one_epoch"] else " (across an epoch's end)"
        ceil = f"{100 * r['of_ceiling'][n]:.0f} %" if "of_ceiling" in r else "-"
        print(
            f"| {name} | {r['1']['img_s']:,.0f} | {r[n]['img_s']:,.0f}{flag} | {r['scaling']:.2f}x | {ceil} |"
        )
    for key, b in bars.items():
        print(f"{key}: {b['value']} (target {b['target']}, pass={b['pass']})")
    figures = {"config": {**cfg, "size": args.size, "devices": args.devices, "strategy": args.strategy,
                          "independent": args.independent, "bucket_cap_mb": args.bucket_cap_mb,
                          "nccl_max_nchannels": args.nccl_channels}, "usable_cpus": usable_cpus(),
               "cases": results, "skipped": skipped}  # fmt: skip
    print(f"wrote {write_result('scale', figures, bars, args.out)}")


if __name__ == "__main__":
    main()
