"""The resume harness: train a few epochs with a checkpoint after every step and after every validation, resume from
each checkpoint, and count the samples the resumed run repeated and skipped against the uninterrupted run.

``CASES`` names every loader the package makes or wraps; each case builds ``(datamodule, callbacks)`` from a folder
of test data. :func:`resume_counts` runs one case on the CPU (one process, or under DDP when called inside a
two-process script: every rank records its own batches, and the counts are that rank's).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import Dataset

from tests.helpers import IndexDataset

EPOCHS = 3


class IdModel(pl.LightningModule):
    """Records, for every training step, the sample ids of its batch (the labels) and a checksum of its inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.steps: list[list[int]] = []
        self.sums: list[float] = []

    def training_step(self, batch, batch_idx):
        inputs, labels = batch[0], batch[-1]
        self.steps.append([int(i) for i in labels.tolist()])
        self.sums.append(round(float(inputs.double().sum()), 3))
        return inputs.float().mean() * self.w

    def validation_step(self, batch, batch_idx):
        pass

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class WithIds(Dataset):
    """A dataset whose labels are the sample indices (bad samples pass through as they are)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:  # classes, ignored_files, bad_samples, bad_sample_tracker, ...
        if name.startswith("__") or name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, i: int):
        from lightning_gpu_boost.core.bad_samples import BadSample

        item = self.dataset[i]
        return item if isinstance(item, BadSample) else (item[0], i)


def _ids(module_class: type) -> type:
    class Ids(module_class):
        def _dataset(self, root, train):
            return WithIds(super()._dataset(root, train))

    return Ids


#: the DataLoader workers' start method in multi-process runs (``None``: the platform's, fork on Linux). Forking a
#: DDP rank, whose other threads come and go, can leave a worker stuck inside ``fork()`` on CPython 3.11 (seen in CI:
#: a thread state being deleted at the moment of the fork); the DDP harness scripts set ``"forkserver"``, with the
#: server started by :func:`start_forkserver_by_fork`
WORKER_CONTEXT: str | None = None


def start_forkserver_by_fork() -> None:
    """Start this process's multiprocessing fork server as a fork of this process as it is (torch, Lightning and the
    tests' modules imported), where multiprocessing would start a fresh interpreter that imports them again: about
    5 s of CPU per DDP rank on the 2-CPU CI machine.

    Call it first in a rank, while the process has one thread (a rank forked from ``tests/warm_python.py``'s server
    or by torchrun's ``--start-method fork``): the fork server, and every worker it forks, then start from a process
    without threads, which is what ``WORKER_CONTEXT = "forkserver"`` is for. The server goes when this process does
    (its "alive" pipe closes), as multiprocessing's own does."""
    import os
    import socket
    from multiprocessing import connection, forkserver, resource_tracker, util

    server = forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None:
            return
        resource_tracker.ensure_running()
        with socket.socket(socket.AF_UNIX) as listener:
            address = connection.arbitrary_address("AF_UNIX")
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()  # this process holds the write end: the server ends when it closes
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(alive_w)
                    forkserver.main(listener.fileno(), alive_r, [])
                finally:
                    os._exit(0)
            os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid


def _boost(workers: int, n: int = 14):
    from lightning_gpu_boost.datamodules import BoostDataModule

    class Indexed(BoostDataModule):
        def train_dataset(self):
            return IndexDataset(n)

        def val_dataset(self):
            return IndexDataset(4)

        def dataloader_kwargs(self, dataset, stage):
            kwargs = super().dataloader_kwargs(dataset, stage)
            if kwargs.get("num_workers") and WORKER_CONTEXT is not None:
                kwargs["multiprocessing_context"] = WORKER_CONTEXT
            return kwargs

    return Indexed(batch_size=4, num_workers=workers)


class UserLoaders(pl.LightningDataModule):
    """A user's own DataModule: a plain ``DataLoader`` over 14 indexed samples, built anew at each call."""

    def __init__(self, sampling: str, workers: int = 2) -> None:
        super().__init__()
        self.sampling, self.workers = sampling, workers

    def train_dataloader(self):
        from torch.utils.data import DataLoader

        kwargs: dict[str, Any] = {"shuffle": self.sampling != "sequential"}
        if self.sampling == "seeded":
            kwargs["generator"] = torch.Generator().manual_seed(5)
        if self.workers and WORKER_CONTEXT is not None:
            kwargs["multiprocessing_context"] = WORKER_CONTEXT
        return DataLoader(IndexDataset(14), batch_size=4, num_workers=self.workers, **kwargs)

    def val_dataloader(self):
        from torch.utils.data import DataLoader

        return DataLoader(IndexDataset(4), batch_size=4)


def _user_case(name: str) -> tuple[Any, list[Any]]:
    """``{part}_{sampling}``: the user's plain loader with one of our parts (gpu_boost, span_epochs, auto_workers)."""
    from lightning_gpu_boost.callbacks import AutoNumWorkers, GPUBoost, SpanEpochs

    part, sampling = name.rsplit("_", 1)
    parts = {"gpu_boost": lambda: GPUBoost(auto_workers=False, watchdog=False), "span_epochs": SpanEpochs,
             "auto_workers": lambda: AutoNumWorkers(workers_budget_s=1.0, use_cache=False, max_workers=2)}  # fmt: skip
    return UserLoaders(sampling), [parts[part]()]


def _noise(batch):
    x, y = batch
    return x + torch.rand(x.shape), y


def case(name: str, data: dict[str, Path]) -> tuple[Any, list[Any]]:
    """``(datamodule, callbacks)`` of case ``name``; ``data`` holds ``tree``, ``broken`` (a tree with broken files)
    and ``pack`` (an LMDB pack of ``tree``)."""
    from lightning_gpu_boost.callbacks import GPUBoost, StreamPrefetch
    from lightning_gpu_boost.datamodules import ImageFolderDataModule, LMDBDataModule

    image = {"image_size": 16, "batch_size": 4, "num_workers": 0, "val_split": 0.2}
    if name.startswith(("gpu_boost_", "span_epochs_", "auto_workers_")):
        return _user_case(name)
    if name == "boost":
        return _boost(0), []
    if name == "boost_workers":
        return _boost(2), []
    if name == "gpu_boost":  # SpanEpochs wraps the short-epoch loader
        return _boost(2), [GPUBoost(auto_workers=False, watchdog=False)]
    if name == "image_folder":
        return _ids(ImageFolderDataModule)(str(data["tree"]), **image), []
    if name == "lmdb_random":
        return _ids(LMDBDataModule)(str(data["pack"]), **image), []
    if name == "lmdb_block":
        return _ids(LMDBDataModule)(str(data["pack"]), order="block", block_bytes=4096, window_blocks=2, **image), []
    if name == "skip_refill":
        return _ids(ImageFolderDataModule)(str(data["broken"]), bad_samples="skip", **image), []
    if name == "transform_seeds":
        return _boost(0), [StreamPrefetch(transform=_noise)]
    if name == "dali":
        from tests.helpers import id_dali_datamodule

        return id_dali_datamodule(str(data["tree"]), str(data["tree"]), image_size=16, batch_size=4,
                                  device="cpu", num_threads=1, read_threads=1), []  # fmt: skip
    if name == "dali_skip":
        from tests.helpers import id_dali_datamodule

        return id_dali_datamodule(str(data["broken"]), image_size=16, batch_size=4, device="cpu", num_threads=1,
                                  read_threads=1, bad_samples="skip"), []  # fmt: skip
    raise KeyError(name)


#: every loader the package makes or wraps (DALI cases need nvidia-dali)
CASES = ("boost", "boost_workers", "gpu_boost", "image_folder", "lmdb_random", "lmdb_block", "skip_refill",
         "transform_seeds", "dali", "dali_skip")  # fmt: skip
#: the user's own plain DataLoader (sequential, shuffled, shuffled with a seeded generator) under each of our parts
USER_CASES = tuple(f"{part}_{sampling}" for part in ("gpu_boost", "span_epochs", "auto_workers")
                   for sampling in ("sequential", "random", "seeded"))  # fmt: skip
#: cases whose inputs are the same on every resume (no random crops drawn by workers): checksums compared too
SAME_VALUES = ("boost", "boost_workers", "gpu_boost", "transform_seeds", *USER_CASES)


def _fit(name: str, data: dict[str, Path], root: Path, trainer_kwargs: dict, ckpt: Path | None = None,
         save: Path | None = None) -> IdModel:  # fmt: skip
    datamodule, callbacks = case(name, data)
    if save is not None:
        callbacks = callbacks + [
            ModelCheckpoint(dirpath=save, filename="s-{step}", every_n_train_steps=1, save_top_k=-1),
            ModelCheckpoint(dirpath=save, filename="v-{epoch}-{step}", every_n_epochs=1, save_top_k=-1,
                            save_on_train_epoch_end=False),
        ]  # fmt: skip
    model = IdModel()
    trainer = pl.Trainer(
        max_epochs=EPOCHS, callbacks=callbacks, enable_checkpointing=save is not None, logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root), num_sanity_val_steps=0,
        **trainer_kwargs,
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule, ckpt_path=None if ckpt is None else str(ckpt))
    return model


def compare(expected: list[list[int]], resumed: list[list[int]]) -> tuple[int, int]:
    """Samples the resumed run repeated and skipped against ``expected`` (counted as multisets)."""
    want = Counter(i for batch in expected for i in batch)
    got = Counter(i for batch in resumed for i in batch)
    return sum((got - want).values()), sum((want - got).values())


def resume_counts(name: str, data: dict[str, Path], root: Path, **trainer_kwargs: Any) -> dict[str, Any]:
    """Run case ``name`` uninterrupted with checkpoints, then resume from every checkpoint. Returns the totals
    (``resumes``, ``repeated``, ``skipped``, ``wrong_order``, ``wrong_values``) and the failing checkpoints."""
    ckpt_dir = root / f"{name}-ckpt"
    whole = _fit(name, data, root / f"{name}-whole", trainer_kwargs, save=ckpt_dir)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    out = {"case": name, "resumes": 0, "repeated": 0, "skipped": 0, "wrong_order": 0, "wrong_values": 0,
           "failures": []}  # fmt: skip
    for path in sorted(ckpt_dir.glob("*.ckpt")):
        step = int(torch.load(path, map_location="cpu", weights_only=False)["global_step"])
        resumed = _fit(name, data, root / f"{name}-resume", trainer_kwargs, ckpt=path)
        expected = whole.steps[step:]
        repeated, skipped = compare(expected, resumed.steps)
        wrong_order = int(resumed.steps != expected and not (repeated or skipped))
        wrong_values = int(name in SAME_VALUES and resumed.sums != whole.sums[step:])
        out["resumes"] += 1
        for key, value in (("repeated", repeated), ("skipped", skipped), ("wrong_order", wrong_order),
                           ("wrong_values", wrong_values)):  # fmt: skip
            out[key] += value
        if repeated or skipped or wrong_order or wrong_values:
            out["failures"].append({"ckpt": path.name, "step": step, "repeated": repeated, "skipped": skipped,
                                    "expected": expected, "resumed": resumed.steps})  # fmt: skip
    return out


def make_data(root: Path) -> dict[str, Path]:
    """The harness's data: a 20-image tree, the same tree with broken files, and an LMDB pack of the tree."""
    from lightning_gpu_boost.core.bad_samples import add_broken_files
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.lmdb import pack_image_folder

    tree = make_jpeg_folder(root / "tree", n=20, num_classes=2, size_range=(40, 56, 32, 48), progress=False)
    broken = Path(make_jpeg_folder(root / "broken", n=43, num_classes=2, size_range=(40, 56, 32, 48), progress=False))
    for path in add_broken_files(broken):
        if "truncated_jpeg" in path:  # whether it decodes depends on the random crop drawn: bad on some draws only
            (broken / path).unlink()
    pack = pack_image_folder(tree, root / "tree.lmdb", progress=False)
    return {"tree": Path(tree), "broken": Path(broken), "pack": Path(pack)}
