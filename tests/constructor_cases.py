"""Wrong values for every argument of every public constructor, and what a right answer looks like.

Each case is ``(class, valid keyword arguments, argument, wrong value)``. The constructor must raise at once
(ValueError, TypeError or FileNotFoundError) with a message that names the argument. Shared by
``tests/test_constructors.py`` (a hypothesis property test) and ``benchmarks/integrity.py`` (the counted bar).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

NAN, INF = math.nan, math.inf

#: wrong values by kind of argument
WRONG: dict[str, list[Any]] = {
    "bool": ["no", "yes", "True", 0, 1, 2, 1.0, None, [True]],
    "bool?": ["no", "false", 0, 1, 2.5, [None]],
    "int>=0": [-1, 2.5, "3", True, NAN, INF, None, [1]],
    "int>=0?": [-1, 2.5, "3", True, NAN, [1]],
    "int>=1": [0, -3, 2.5, "4", True, NAN, None],
    "int>=1?": [0, -3, 2.5, "4", False, NAN],
    "nice": [-1, 20, 2.5, "5", True],
    "float>0": [0, -1.0, NAN, INF, "1", True, None],
    "float>=0": [-1.0, NAN, INF, "1", True, None],
    "unit": [-0.1, 1.5, NAN, INF, "0.5", True, None],  # [0, 1]
    "unit_open": [-0.1, 1.0, 1.5, NAN, "0.5", True, None],  # [0, 1)
    "open01": [0.0, 1.0, -0.2, NAN, "0.2", True, None],  # (0, 1)
    "percent": [0, -5, 101, NAN, "80", True, None],  # (0, 100]
    "pair01": [(0.5, 0.2), (0.0, 1.0), (0.1, 2.0), (NAN, 1.0), "0.1,1", (0.5,), None],
    "pair>0": [(2.0, 1.0), (0.0, 1.0), (-1.0, 1.0), (NAN, 1.0), "1,2", (1.0,), None],
    "normalize": [((0.5,), (0.0,)), ((0.5, 0.5), (1.0,)), ((NAN,), (1.0,)), ((0.5,), (-1.0,)), "imagenet", (1, 2),
                  ((), ())],
    "dtype": ["float64", "fp16", 16, None, True],
    "path": ["/no/such/path/anywhere", 3, ""],
    "path?": ["/no/such/path/anywhere", 3],
    "writable?": ["/no/such/folder/out.png", 3, "/proc/out.png"],
    "backend?": ["bogus", 3, True, ""],
    "compression": ["fp32", "float16", 16, None, True],
    "timeout?": [5, "30", 1.5],
    "callable?": [3, "collate"],
    "dict?": ["a=1", [("a", 1)], {1: 2}],
    "key?": [2.5, True, [0]],
    "str": [3, "", None, True],
    "str?": [3, "", True],
}


def cases(jpeg_tree: Any, pack: Any) -> Iterator[tuple[Callable[..., Any], dict[str, Any], str, Any]]:
    """Every (class, valid kwargs, argument, wrong value); ``jpeg_tree``: an image folder; ``pack``: its LMDB pack."""
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.callbacks import (
        AutoNumWorkers,
        GPUBoost,
        GPUUtilWatchdog,
        SpanEpochs,
        StreamPrefetch,
    )
    from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
    from lightning_gpu_boost.core.block_shuffle import BlockShuffleSampler
    from lightning_gpu_boost.core.gpu_transforms import JointAugment, LogMel, RandomResizedCropFlip
    from lightning_gpu_boost.core.shapes import ShapeWatch
    from lightning_gpu_boost.core.spanning import SpanningLoader
    from lightning_gpu_boost.datamodules import BoostDataModule, ImageFolderDataModule
    from lightning_gpu_boost.datamodules.dali import DALIDataModule
    from lightning_gpu_boost.datamodules.image_folder import ImageFolderDataset
    from lightning_gpu_boost.datamodules.lmdb import LMDBDataModule, LMDBImageDataset, LMDBSampleDataset
    from lightning_gpu_boost.datamodules.streaming import StreamingDataModule
    from lightning_gpu_boost.strategies.presets import DDPBoostStrategy

    tree, lmdb = str(jpeg_tree), str(pack)
    wrong_values = {**WRONG, **wrong_paths(jpeg_tree, pack)}
    boost = {"batch_size": "int>=1", "num_workers": "int>=0?", "pin_memory": "bool?", "persistent_workers": "bool",
             "prefetch_factor": "int>=1", "drop_last": "bool", "shuffle": "bool", "collate_fn": "callable?",
             "prefetch": "bool", "normalize": "normalize", "workers_budget_s": "float>0", "worker_niceness": "nice"}
    image = {"image_size": "int>=1", "train": "bool", "val_resize": "int>=1?", "scale": "pair01", "bad_samples": "dtype"}
    folder_dm = {"val_root": "path?", "val_split": "unit_open", "image_size": "int>=1", "val_resize": "int>=1?",
                 "scale": "pair01", "bad_samples": "dtype", "split_seed": "int>=0", **boost}
    specs: list[tuple[Callable[..., Any], dict[str, Any], dict[str, str]]] = [
        (StreamPrefetch, {}, {"normalize": "normalize", "image_key": "key?", "dtype": "dtype",
                              "channels_last": "bool", "depth": "int>=1", "cpu_lookahead": "bool",
                              "move_normalize": "bool", "transform": "callable?", "val_transform": "callable?",
                              "transform_seed": "int>=0?"}),
        (GPUUtilWatchdog, {}, {"window": "int>=1", "warmup_steps": "int>=0", "wait_threshold": "open01",
                               "util_threshold": "percent", "on_starvation": "dtype", "warn_every_n_steps": "int>=1",
                               "sample_interval_s": "float>0", "plot_path": "writable?", "summary": "bool"}),
        (AutoNumWorkers, {}, {"budget_s": "float>0", "tune_val": "bool", "use_cache": "bool",
                              "cache_path": "writable?", "keep_user_value": "bool", "max_workers": "int>=0?",
                              "tolerance": "unit_open", "prefetch_factor": "int>=1", "persistent_workers": "bool",
                              "worker_niceness": "nice"}),
        (GPUBoost, {}, {"prefetch": "bool", "auto_workers": "bool", "watchdog": "bool", "tf32": "bool",
                        "cudnn_benchmark": "bool", "channels_last": "bool", "normalize": "normalize",
                        "normalize_dtype": "dtype", "workers_budget_s": "float>0", "on_starvation": "dtype",
                        "move_normalize": "bool", "transform": "callable?", "val_transform": "callable?",
                        "span_epochs": "bool"}),
        (SpanEpochs, {}, {"train": "bool", "val": "bool", "min_restart_share": "unit_open"}),
        (ThroughputMeter, {}, {"warmup": "int>=0", "steps": "int>=1?", "sample_gpu_util": "bool"}),
        (BoostDataModule, {}, boost),
        (ImageFolderDataset, {"root": tree}, {"root": "image_root", **image}),
        (ImageFolderDataModule, {"train_root": tree}, {"train_root": "image_root", **folder_dm,
                                                       "val_root": "image_root?"}),
        (LMDBImageDataset, {"path": lmdb}, {"path": "pack", **image, "check_crc": "bool"}),
        (LMDBSampleDataset, {"path": lmdb}, {"path": "pack", "decode": "callable?", "check_crc": "bool"}),
        (LMDBDataModule, {"train_root": lmdb}, {"train_root": "pack", "check_crc": "bool", **folder_dm,
                                                 "val_root": "pack?", "order": "dtype", "block_bytes": "int>=1",
                                                 "window_blocks": "int>=1"}),
        (StreamingDataModule, {"train_dir": "s3://bucket/prefix"},
         {"train_dir": "str", "val_dir": "str?", "image_size": "int>=1", "val_resize": "int>=1?", "scale": "pair01",
          "storage_options": "dict?", "cache_dir": "str?", "max_cache_size": "str", "max_pre_download": "int>=1",
          "seed": "int>=0", "check_source": "bool", "bad_samples": "dtype", "stall_s": "float>0", **boost}),
        (DDPBoostStrategy, {}, {"process_group_backend": "backend?", "timeout": "timeout?", "start_method": "dtype",
                                "gradient_as_bucket_view": "bool", "broadcast_buffers": "bool",
                                "bucket_cap_mb": "float>0", "static_graph": "bool", "find_unused_parameters": "bool",
                                "gradient_compression": "compression"}),
        (RandomResizedCropFlip, {}, {"size": "int>=1", "scale": "pair01", "ratio": "pair>0", "flip": "bool",
                                     "normalize": "normalize", "antialias": "bool"}),
        (JointAugment, {}, {"degrees": "float>=0", "scale": "pair>0", "flip": "bool", "jitter": "unit_open",
                            "ignore_index": "int>=0", "size": "int>=1?", "elastic": "float>=0"}),
        (LogMel, {}, {"source_rate": "int>=1", "rate": "int>=1", "n_fft": "int>=1", "hop": "int>=1",
                      "n_mels": "int>=1", "pad_to": "int>=1"}),
        (ShapeWatch, {}, {"limit": "int>=1"}),
        (SpanningLoader, {"loader": DataLoader(list(range(8)))}, {"batches_per_epoch": "int>=1?", "span": "bool"}),
        (BlockShuffleSampler, {"dataset": range(8), "block_size": 4},
         {"block_size": "int>=1", "window_blocks": "int>=1", "seed": "int>=0", "drop_last": "bool"}),
        (DALIDataModule, {"train_root": tree}, {"train_root": "source", "val_root": "source?", "batch_size": "int>=1",
                                                "val_batch_size": "int>=1?", "image_size": "int>=1",
                                                "val_resize": "int>=1?", "scale": "pair01", "ratio": "pair>0",
                                                "flip": "bool", "normalize": "normalize", "dtype": "dtype",
                                                "channels_last": "bool", "device": "dtype",
                                                "hw_decoder_load": "unit", "num_threads": "int>=1?",
                                                "read_threads": "int>=1", "prefetch_queue_depth": "int>=1",
                                                "shuffle": "bool", "seed": "int>=0", "drop_last": "bool",
                                                "check_crc": "bool", "pipelines": "int>=1?",
                                                "decoder_options": "dict?", "pipeline_options": "dict?",
                                                "decoder_device": "dtype", "order": "dtype",
                                                "block_bytes": "int>=1", "window_blocks": "int>=1"}),
    ]  # fmt: skip
    for cls, valid, args in specs:
        for arg, kind in args.items():
            for wrong in wrong_values[kind]:
                if cls is GPUUtilWatchdog and arg == "window" and wrong == 1:
                    continue  # 1 is wrong here too (window >= 2), but listed once under int>=1
                yield cls, valid, arg, wrong


def wrong_paths(jpeg_tree: Any, pack: Any) -> dict[str, list[Any]]:
    """Wrong paths made next to ``jpeg_tree``: a file where a folder must be, an empty folder, a folder of another
    tree's classes, a file that is no pack, an LMDB file that is not a complete pack, an interrupted pack."""
    import shutil
    from pathlib import Path

    import lmdb

    from lightning_gpu_boost.core.lmdb import META

    root = Path(jpeg_tree).parent / "wrong-paths"
    root.mkdir(exist_ok=True)
    empty, text, incomplete = root / "empty", root / "notes.txt", root / "incomplete.lmdb"
    empty.mkdir(exist_ok=True)
    text.write_text("not an LMDB pack\n")
    other_classes = root / "other"
    for name in ("cats", "dogs", "owls"):
        (other_classes / name).mkdir(parents=True, exist_ok=True)
    if not incomplete.exists():
        env = lmdb.open(str(incomplete), subdir=False, max_dbs=2)
        with env.begin(write=True, db=env.open_db(META)) as txn:
            txn.put(b"schema_version", b"2")
        env.close()
        shutil.copy(incomplete, root / "interrupted.lmdb.partial")
    interrupted = str(root / "interrupted.lmdb")
    missing = "/no/such/path/anywhere"
    packs = [str(jpeg_tree), str(text), str(incomplete), interrupted, str(empty), missing, 3, ""]
    folders = [str(pack), str(text), str(empty), missing, 3, ""]
    return {
        "image_root": folders, "image_root?": [*folders[:-1], str(other_classes)],
        "pack": packs, "pack?": packs[:-1],
        "source": [str(text), str(incomplete), interrupted, str(empty), missing, 3, ""],
        "source?": [str(text), str(incomplete), str(empty), str(other_classes), missing, 3],
        "writable?": [*WRONG["writable?"], str(root)],
    }  # fmt: skip


def outcome(cls: Callable[..., Any], valid: dict[str, Any], arg: str, wrong: Any) -> str:
    """``"named"`` (raised at construction, naming the argument), ``"unnamed"`` (raised without its name) or
    ``"accepted"`` (a wrong value taken: it would fail late, or never)."""
    kwargs = {**valid, arg: wrong}
    try:
        obj = cls(**kwargs)
    except (ValueError, TypeError, FileNotFoundError) as err:
        return "named" if arg in str(err) else f"unnamed: {type(err).__name__}: {err}"
    finally:
        pass
    teardown = getattr(obj, "teardown", None)
    if cls.__name__ == "DALIDataModule" and callable(teardown):
        teardown("fit")
    return "accepted"
