"""Data bigger than RAM: a pack read from a cold page cache in block-shuffled order, against the disk's sequential
speed and against a folder of files read in random order; training from a cold pack against the same run warm; and
the block order's effect on the loss of a short run, in one run.

    python benchmarks/bigger_than_ram.py                              # the GPU machine (root: drops caches)
    python benchmarks/bigger_than_ram.py --copies 2 --parts reads loss --loss-epochs 2   # a quick CPU run
    python benchmarks/bigger_than_ram.py --parts reads --keep benchmarks/results/bigger_than_ram-<date>-h100.json
        # the reads again; the other parts carried over from the earlier result, each with its commit

A pack larger than the machine's memory cannot be made on a 64 GiB disk beside 128 GiB of RAM, so "bigger than RAM"
is emulated: caches are dropped before every cold cell (``echo 3 > /proc/sys/vm/drop_caches``, else
``posix_fadvise(DONTNEED)`` per file; the JSON says which), and the readers' whole-pack prefetch at open
(``page_cache.WHOLE_PACK_PREFETCH_FRACTION``, which reads packs up to a quarter of the available memory in one
pass) is turned off, as it is for a pack that does not fit. The pack holds the demo JPEGs (``--images``, ~70 KiB
each) ``--copies`` times over (copies in the source tree, so the pack has ``images x copies`` records, each read
from disk), packed in a shuffled order (``pack --shuffle-seed 0``, as docs/block_shuffle.md advises).

Parts (``--parts``):

- ``reads``: no decoding. ``dd`` reads the pack (8 MiB blocks) after a drop: the disk's sequential bandwidth. Then,
  each after a drop, an epoch of the pack in block-shuffled order (``BlockShuffleSampler`` over 4 MiB blocks,
  16-block windows, asking for the next window's blocks, one read each, as each window starts) and the same number of distinct files of
  the source tree in a full random order, both through a DataLoader with the training loader's workers (usable
  CPUs - 1; every record's CRC checked, every file read whole), and both again one record at a time in this process.
  Bytes/s of the whole pass from the first batch to the last (the workers' start left out): dd's figure is a whole
  pass too, and a cold pass is not stationary (the kernel reads up to ``read_ahead_kb`` around each fault, 8 MiB on
  the H100 machine, so later blocks are partly in memory already); each cell's steady window and halves are in the
  JSON for reference, and ``steady_state_halves_max_diff`` covers the training windows.
  Bars: the block-shuffled epoch read with the workers >= 70 % of ``dd``; one record at a time, >= 3x the files in
  random order (as lmdb_read.py compares reads: one at a time, where each random read waits for the disk; with 15
  workers the files' reads overlap each other too, and both ratios are in the JSON). No order can beat the disk:
  ``fastest_read_vs_random_files_one_at_a_time`` (the fastest of ``dd``, the pack read by 16 threads in 8 MiB
  ``O_DIRECT`` pieces, ``parallel_read_bytes_s``, and the block order with workers and one at a time, over the
  files one at a time) is the most the second bar could reach in the run. The same cells, with bars
  suffixed ``_4KB``, for a second pack of ``--small-records`` records of ~4 KB (random bytes, a token window or a
  feature vector per file; a tenth of the files read in random order per cell).
- ``train``: ResNet-50 (bf16-mixed, channels_last, batch 256) fed by ``LMDBDataModule(order="block")`` (decode on
  the CPU, 15 workers) and by ``DALIDataModule(order="block")`` (where DALI is installed), each cold (caches
  dropped just before) and warm (the pack read once before), alternating, twice each, within one epoch;
  ThroughputMeter's window, medians. Bars: cold >= 90 % of warm, for each.
- ``loss``: a learnable synthetic task (``--loss-classes`` classes told apart by a colour pattern, 64 px JPEGs),
  packed class by class and shuffled; a small CNN trained for ``--loss-epochs`` epochs with a full shuffle
  (``order="random"``) and with the block order on the shuffled pack, ``--loss-seeds`` seeds each (the seed sets the
  weights and the order); the final validation loss. Blocks and windows are scaled to the small pack (``--loss-block-
  records`` records per block, 16 blocks per window) so that it holds as many windows as a large pack does (an
  ImageNet pack of ~140 GB holds ~2,000 windows of 64 MiB; this one ``--loss-windows``). The class-sorted pack in
  block order is run once beside them (why ``--shuffle-seed`` matters). Bar: the two mean final losses differ by
  at most two standard errors of their difference (Welch: ``2 * sqrt((var_full + var_block) / seeds)``).
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from _common import carried_over, dd_read, demo_tree, drop_cache, parallel_read, parser_for
from torch.utils.data import DataLoader, Dataset

from lightning_gpu_boost.core.block_shuffle import BlockShuffleSampler, block_size_for
from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.lmdb import close_readers, open_pack, pack_image_folder, page_cache
from lightning_gpu_boost.core.results import bar, write_result
from lightning_gpu_boost.core.steady import steady_window, worst_halves_diff

BLOCK_BYTES, WINDOW_BLOCKS = 4 << 20, 16


def replicate_tree(base: Path, dst: Path, copies: int) -> Path:
    """``base`` (class folders) ``copies`` times over in ``dst``: ``copy<j>_<name>`` in each class (copies, not
    links: the tree scan counts a file once however many names it has)."""
    marker = dst / f".complete-{copies}"
    if marker.exists():
        return dst
    shutil.rmtree(dst, ignore_errors=True)
    for folder in sorted(p for p in base.iterdir() if p.is_dir()):
        out = dst / folder.name
        out.mkdir(parents=True)
        for f in sorted(folder.iterdir()):
            for j in range(copies):
                shutil.copyfile(f, out / f"copy{j}_{f.name}")
    marker.touch()
    return dst


class RawPack(Dataset):
    """A pack's records as their sizes (the CRC check touches every byte)."""

    def __init__(self, path: str) -> None:
        self.reader = open_pack(path)

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, i: int) -> int:
        return self.reader.read(i, lambda r: len(r.payload))


class RawFiles(Dataset):
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        with open(self.paths[i], "rb") as f:
            return len(f.read())


def timed_read(dataset: Dataset, order: list[int], workers: int) -> dict:
    """Bytes/s reading ``order`` (one item at a time here with ``workers=0``, else a DataLoader's workers), over the
    steady window (the workers' queue skipped, halves compared)."""
    batch = 64
    loader = DataLoader(dataset, batch_size=batch, sampler=order, num_workers=workers, collate_fn=sum,
                        prefetch_factor=2 if workers else None)  # fmt: skip
    times, units = [time.perf_counter()], [0.0]
    start = times[0]
    for nbytes in loader:
        times.append(time.perf_counter())
        units.append(float(nbytes))
    total_s = times[-1] - start
    # the pass: every byte after the first batch over the time from it to the last one (the workers' start left
    # out), a whole-pass figure as dd's is; the steady window (the queue skipped at both ends) for reference
    pass_s = sum(units[2:]) / (times[-1] - times[1]) if len(times) > 2 else float("nan")
    queue = 2 * workers
    end = len(times) - queue
    w = steady_window(times[:end], units[:end], warmup=0, queue=queue)
    return {"bytes_s": pass_s, "items": len(order), "bytes": sum(units), "total_s": total_s,
            "whole_read_bytes_s": sum(units) / total_s, "workers": workers, "window": w.as_dict()}  # fmt: skip


def warm_up(path: str) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass


def block_sampler(pack: str, workers: int) -> BlockShuffleSampler:
    """The epoch's block order over ``pack``, asking a window ahead as LMDBDataModule(order="block") does (a reader
    opened after the cell's cache drop; without workers, the blocks are mapped ahead into this process too)."""
    n = len(open_pack(pack))
    sampler = BlockShuffleSampler(range(n), block_size_for(n, os.path.getsize(pack), BLOCK_BYTES), WINDOW_BLOCKS,
                                  seed=0, num_replicas=1, rank=0)  # fmt: skip
    sampler.will_need = partial(open_pack(pack).will_need, populate=not workers)
    return sampler


def reads_part(pack: str, files: list[str], workers: int, files_limit: int, suffix: str = "") -> tuple[dict, dict]:
    """The ``reads`` part for one pack and the distinct source files of its records: figures and bars (their names
    end in ``suffix``)."""
    n = len(open_pack(pack))
    block = block_size_for(n, os.path.getsize(pack), BLOCK_BYTES)

    file_order = random.Random(0).sample(range(len(files)), min(len(files), files_limit))
    out: dict = {"records": n, "pack_bytes": os.path.getsize(pack), "block_records": block, "files": len(file_order)}
    how = drop_cache([pack])
    out["cache_drop"] = how
    out["dd_bytes_s"] = dd_read(pack)
    drop_cache([pack])  # O_DIRECT reads pass the cache; where the filesystem refuses it, they are buffered
    out["parallel_read_bytes_s"] = parallel_read(pack)
    for name, w in (("workers", workers), ("one_at_a_time", 0)):
        close_readers(pack)
        drop_cache([pack])
        out[f"block_{name}"] = timed_read(RawPack(pack), block_sampler(pack, w), w)
        close_readers(pack)
        drop_cache([pack])
        out[f"random_pack_{name}"] = timed_read(RawPack(pack), random.Random(1).sample(range(n), len(file_order)), w)
        drop_cache(files)
        out[f"random_files_{name}"] = timed_read(RawFiles(files), file_order, w)
        print(f"reads ({name}): dd {out['dd_bytes_s'] / 1e6:,.0f} MB/s; block order "
              f"{out[f'block_{name}']['bytes_s'] / 1e6:,.0f} MB/s; random pack records "
              f"{out[f'random_pack_{name}']['bytes_s'] / 1e6:,.0f} MB/s; random files "
              f"{out[f'random_files_{name}']['bytes_s'] / 1e6:,.0f} MB/s")  # fmt: skip
    for name in ("workers", "one_at_a_time"):
        out[f"block_vs_random_files_{name}"] = out[f"block_{name}"]["bytes_s"] / out[f"random_files_{name}"]["bytes_s"]
    # the most any order could reach over the files one at a time in this run: the fastest the pack was read at all
    fastest = max(out["dd_bytes_s"], out["parallel_read_bytes_s"],
                  *(out[f"block_{k}"]["bytes_s"] for k in ("workers", "one_at_a_time")))  # fmt: skip
    out["fastest_read_vs_random_files_one_at_a_time"] = fastest / out["random_files_one_at_a_time"]["bytes_s"]
    return out, reads_bars(out, suffix)


def reads_bars(out: dict, suffix: str = "") -> dict:
    return {f"block_epoch_read_of_dd{suffix}": bar(out["block_workers"]["bytes_s"] / out["dd_bytes_s"], 0.70, "ratio"),
            f"block_read_vs_random_files{suffix}": bar(out["block_vs_random_files_one_at_a_time"], 3.0, "x")}  # fmt: skip


def train_bars(out: dict) -> dict:
    return {f"train_cold_of_warm_{kind}": bar(v["cold_of_warm"], 0.90, "ratio") for kind, v in out.items()
            if isinstance(v, dict) and "cold_of_warm" in v}  # fmt: skip


def loss_bars(out: dict) -> dict:
    return {"block_order_final_loss_diff": bar(out["diff"], round(out["allowed_diff"], 4), "val_loss",
                                               higher_is_better=False)}  # fmt: skip


def small_records(data: Path, n: int) -> tuple[Path, Path]:
    """``n`` files of 4,000 random bytes in 100 folders (a token window, a feature vector, a small crop per file),
    and their pack in a shuffled order."""
    from lmdb_read import make_tree  # the benchmarks' folder is on the path (the script's own)

    tree, pack = data / f"small-{n}", data / f"small-{n}.lmdb"
    if not (tree / ".complete").exists():
        shutil.rmtree(tree, ignore_errors=True)
        make_tree(tree, n, 4_000, classes=100)
        (tree / ".complete").touch()
    if not pack.exists():
        pack_image_folder(tree, pack, progress=False, shuffle_seed=0, check="none")  # random bytes: no image check
    return tree, pack


def train_part(pack: str, args) -> tuple[dict, dict]:
    from _common import fit_resnet50

    from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
    from lightning_gpu_boost.datamodules import LMDBDataModule

    n = len(open_pack(pack))
    steps = min(args.train_steps, n // args.batch_size - 1)  # one epoch: every record read once
    out: dict = {"steps": steps, "warmup": args.train_warmup}

    def run(kind: str, cache: str) -> dict:
        close_readers(pack)
        if cache == "cold":
            out.setdefault("cache_drop", drop_cache([pack]))
        else:
            warm_up(pack)
        if kind == "lmdb":
            dm = LMDBDataModule(pack, batch_size=args.batch_size, num_workers=max(1, usable_cpus() - 1),
                                order="block")  # fmt: skip
        else:
            from lightning_gpu_boost.datamodules.dali import DALIDataModule

            dm = DALIDataModule(pack, batch_size=args.batch_size, dtype="bfloat16", channels_last=True,
                                order="block")  # fmt: skip
        meter = ThroughputMeter(warmup=args.train_warmup)
        fit_resnet50(dm, steps, [meter])
        result = meter.summary()
        print(f"train {kind} {cache}: {result['samples_per_s']:,.0f} img/s, data wait {result['data_wait_frac']:.2f}")
        return result

    kinds = ["lmdb"]
    try:
        import nvidia.dali  # noqa: F401

        kinds.append("dali")
    except ImportError:
        out["dali"] = "not installed"
    for kind in kinds:  # cold and warm alternate, twice each: medians (two runs of one case differ by several %)
        runs = {"cold": [], "warm": []}
        for _ in range(2):
            for cache in ("cold", "warm"):
                runs[cache].append(run(kind, cache))
        cold, warm = (statistics.median(r["samples_per_s"] for r in runs[c]) for c in ("cold", "warm"))
        out[kind] = {"cold_runs": runs["cold"], "warm_runs": runs["warm"], "cold_img_s": cold, "warm_img_s": warm,
                     "cold_of_warm": cold / warm}  # fmt: skip
    return out, train_bars(out)


def make_learnable_tree(root: Path, classes: int, per_class: int, salt: int, size: int = 64) -> Path:
    """Class folders of ``size`` px JPEGs: each class a fixed coarse colour pattern, each image that pattern moved
    by a random offset, plus noise (learnable, not trivially)."""
    from PIL import Image

    marker = root / f".complete-{classes}-{per_class}-{size}"
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    for c in range(classes):
        coarse = np.random.default_rng(c).integers(0, 256, size=(4, 4, 3), dtype=np.uint8)  # the class's pattern
        rng = np.random.default_rng([c, salt])  # the images' draws: other ones for the validation set
        field = np.asarray(Image.fromarray(coarse).resize((2 * size, 2 * size), Image.BICUBIC), dtype=np.float32)
        folder = root / f"class_{c:03d}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            dy, dx = rng.integers(0, size // 2, size=2)
            pixels = field[dy : dy + size, dx : dx + size] + rng.normal(0, 40, (size, size, 3))
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"{i:05d}.jpg", quality=90)
    marker.touch()
    return root


def loss_part(data: Path, args) -> tuple[dict, dict]:
    import lightning.pytorch as pl

    from lightning_gpu_boost.datamodules import LMDBDataModule
    from lightning_gpu_boost.models import ImageClassifier

    train_root = make_learnable_tree(data / "learnable-train", args.loss_classes, args.loss_per_class, 1)
    val_root = make_learnable_tree(data / "learnable-val", args.loss_classes, max(1, args.loss_per_class // 5), 2)
    packs = {}
    for name, seed in (("sorted", None), ("shuffled", 0)):
        packs[name] = data / f"learnable-{name}.lmdb"
        if not packs[name].exists():
            pack_image_folder(train_root, packs[name], progress=False, shuffle_seed=seed)
    val_pack = data / "learnable-val.lmdb"
    if not val_pack.exists():
        pack_image_folder(val_root, val_pack, progress=False)
    n = len(open_pack(packs["shuffled"]))
    record = os.path.getsize(packs["shuffled"]) / n
    block_bytes = max(1, int(args.loss_block_records * record))
    windows = n / (block_size_for(n, os.path.getsize(packs["shuffled"]), block_bytes) * WINDOW_BLOCKS)

    def final_loss(pack: Path, order: str, seed: int) -> float:
        torch.manual_seed(seed)
        dm = LMDBDataModule(str(pack), str(val_pack), image_size=32, batch_size=64, num_workers=args.loss_workers,
                            order=order, block_bytes=block_bytes, window_blocks=WINDOW_BLOCKS, split_seed=seed,
                            scale=(0.5, 1.0))  # fmt: skip
        trainer = pl.Trainer(devices=1, max_epochs=args.loss_epochs, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                             check_val_every_n_epoch=args.loss_epochs)  # fmt: skip
        trainer.fit(ImageClassifier("small_cnn", num_classes=args.loss_classes), datamodule=dm)
        return float(trainer.callback_metrics["val_loss"])

    seeds = list(range(args.loss_seeds))
    random_losses = [final_loss(packs["shuffled"], "random", s) for s in seeds]
    block_losses = [final_loss(packs["shuffled"], "block", s) for s in seeds]
    sorted_block = final_loss(packs["sorted"], "block", 0)
    mean_r, mean_b = statistics.mean(random_losses), statistics.mean(block_losses)
    # within noise: the means differ by at most two standard errors of their difference (Welch), over the seeds
    k = len(seeds)
    noise = 2 * ((statistics.variance(random_losses) + statistics.variance(block_losses)) / k) ** 0.5 if k > 1 else 0.0
    out = {"records": n, "record_bytes": record, "block_records": args.loss_block_records, "windows": windows,
           "epochs": args.loss_epochs, "seeds": seeds, "full_shuffle_val_loss": random_losses,
           "block_val_loss": block_losses, "class_sorted_block_val_loss": sorted_block, "full_shuffle_mean": mean_r,
           "block_mean": mean_b, "allowed_diff": noise, "diff": abs(mean_b - mean_r)}  # fmt: skip
    print(f"loss after {args.loss_epochs} epochs: full shuffle {random_losses}, block order {block_losses} "
          f"(class-sorted pack in block order: {sorted_block:.3f}); allowed difference {noise:.3f}")  # fmt: skip
    return out, loss_bars(out)


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--copies", type=int, default=8, help="times the demo JPEGs are packed over")
    parser.add_argument("--parts", nargs="+", default=["reads", "train", "loss"], choices=["reads", "train", "loss"])
    parser.add_argument("--files", type=int, default=8000, help="random-order files read per cell (at most)")
    parser.add_argument("--small-records", type=int, default=200_000,
                        help="a second pack of this many ~4 KB records for the reads (0: none)")
    parser.add_argument("--train-steps", type=int, default=200, help="steps per training run (one epoch at most)")
    parser.add_argument("--train-warmup", type=int, default=40)
    parser.add_argument("--loss-classes", type=int, default=20)
    parser.add_argument("--loss-per-class", type=int, default=300)
    parser.add_argument("--loss-epochs", type=int, default=2)
    parser.add_argument("--loss-seeds", type=int, default=4)
    parser.add_argument("--loss-block-records", type=int, default=8)
    parser.add_argument("--loss-workers", type=int, default=4)
    parser.add_argument("--keep", help="an earlier bigger_than_ram result (JSON): the parts --parts does not re-run "
                        "are carried over, each with the commit it was measured at")  # fmt: skip
    args = parser.parse_args()
    page_cache.WHOLE_PACK_PREFETCH_FRACTION = 0  # read as a pack that does not fit in memory is read
    data = Path(args.data)
    figures: dict = {"config": vars(args), "usable_cpus": usable_cpus()}
    bars: dict = {}
    if "reads" in args.parts or "train" in args.parts:
        base = demo_tree(args)
        tree = replicate_tree(base, data / f"jpeg-{args.images}-x{args.copies}", args.copies)
        pack = data / f"jpeg-{args.images}-x{args.copies}-shuffled.lmdb"
        if not pack.exists():
            start = time.perf_counter()
            pack_image_folder(tree, pack, progress=False, shuffle_seed=0)
            figures["pack_s"] = time.perf_counter() - start
        if "reads" in args.parts:
            files = sorted(str(p) for p in base.rglob("*.jpg"))  # distinct (the pack's records are copies of them)
            figures["reads"], found = reads_part(str(pack), files, max(1, usable_cpus() - 1), args.files)
            bars |= found
            if args.small_records:
                tree, small = small_records(data, args.small_records)
                files = sorted(str(p) for p in tree.rglob("*.jpg"))
                figures["reads_4KB"], found = reads_part(str(small), files, max(1, usable_cpus() - 1),
                                                         args.small_records // 10, suffix="_4KB")  # fmt: skip
                bars |= found
        if "train" in args.parts:
            if not torch.cuda.is_available():
                raise SystemExit("--parts train needs a CUDA GPU.")
            figures["train"], found = train_part(str(pack), args)
            bars |= found
    if "loss" in args.parts:
        figures["loss"], found = loss_part(data, args)
        bars |= found
    if args.keep:  # carried over, with the commit each was measured at, and their bars worked out again
        parts = {"reads": ("reads", "reads_4KB"), "train": ("train",), "loss": ("loss",)}
        names = [n for part, ns in parts.items() if part not in args.parts for n in ns]
        kept = carried_over(args.keep, names)
        figures |= kept
        for name, found in kept.items():
            bars |= (reads_bars(found, "_4KB" if name == "reads_4KB" else "") if name.startswith("reads")
                     else train_bars(found) if name == "train" else loss_bars(found))  # fmt: skip
    timed = {k: figures[k] for k in ("train",) if k in figures}  # the reads are whole passes (see above)
    if timed:
        bars["steady_state_halves_max_diff"] = bar(worst_halves_diff(timed), 0.05, "ratio", higher_is_better=False)
    print(f"wrote {write_result('bigger_than_ram', figures, bars, args.out)}")


if __name__ == "__main__":
    main()
