"""Test helpers: recording modules, indexed datasets and a two-process DDP runner over gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]


class IndexDataset(Dataset):
    """Sample ``i`` is ``(tensor([i, i, i, i], float32), i)``: batches tell which samples they hold."""

    def __init__(self, n: int = 32) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((4,), float(i)), i


def ids(batch) -> list[int]:
    return [int(v) for v in batch[1].tolist()]


class RecordingModel(pl.LightningModule):
    """A linear model that records the sample ids of every batch it sees, per stage."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)
        self.seen: dict[str, list[list[int]]] = {"train": [], "val": [], "test": [], "predict": []}
        self.devices_seen: set[str] = set()

    def _record(self, stage: str, batch) -> torch.Tensor:
        self.seen[stage].append(ids(batch))
        self.devices_seen.add(batch[0].device.type)
        return self.layer(batch[0]).sum()

    def training_step(self, batch, batch_idx):
        return self._record("train", batch)

    def validation_step(self, batch, batch_idx):
        self._record("val", batch)

    def test_step(self, batch, batch_idx):
        self._record("test", batch)

    def predict_step(self, batch, batch_idx):
        return self._record("predict", batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StatefulLoader(DataLoader):
    """A DataLoader that can resume mid-epoch: its state is the number of batches handed out this epoch."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.consumed = 0
        self._skip = 0

    def __iter__(self):
        skip, self._skip = self._skip, 0
        self.consumed = skip
        for i, batch in enumerate(super().__iter__()):
            if i < skip:
                continue
            self.consumed += 1
            yield batch

    def state_dict(self):
        return {"consumed": self.consumed}

    def load_state_dict(self, state):
        self._skip = state["consumed"]


_DIST_VARS = {"LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT"}  # fmt: skip


def _free_port() -> int:
    """A TCP port nobody listens on now: one port per DDP job, so a job never meets the store of an earlier one
    (a fixed port per test session did, where an earlier job's process was still going away); outside the kernel's
    ephemeral range, in this xdist worker's own block (``tests/ports.py``)."""
    from tests.ports import free_port

    return free_port()


def run_ddp(script: str, tmp_path: Path, nprocs: int = 2, timeout: int = 240, launcher: str = "ranks") -> list[dict]:
    """Run ``script`` as a real multi-process Lightning DDP job on CPU (gloo) and return each rank's JSON.

    The script can use ``OUT`` (a folder), ``NPROCS`` and the names of ``tests.helpers``; each rank should write
    ``OUT / f"rank{trainer.global_rank}.json"``.

    ``launcher="ranks"``: every rank is started at once, as torchrun or SLURM start them (``LOCAL_RANK``,
    ``NODE_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` set: Lightning launches nothing itself), each forked from a
    process that has imported torch and Lightning (``tests/warm_python.py``: no 4 s of imports per rank on the
    2-CPU CI machine). ``"lightning"``: ``python script.py``, whose Trainer starts the other ranks itself (its
    subprocess launcher), as a user's ``python train.py`` does.
    """
    path = tmp_path / "ddp_script.py"
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    header = (
        "import json, sys\nfrom pathlib import Path\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.helpers import *\n"
        f"OUT = Path({str(out)!r})\nNPROCS = {nprocs}\n"
    )
    # destroying the process group before exit avoids gloo's "terminate called without an active exception"
    footer = (
        "\nimport torch.distributed as dist\nif dist.is_initialized():\n    dist.destroy_process_group()\n"
    )
    body = textwrap.dedent(script) + footer
    path.write_text(header + "if __name__ == '__main__':\n" + textwrap.indent(body, "    "))
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    # an in-process Trainer(strategy="ddp") of an earlier test leaves LOCAL_RANK, NODE_RANK, ... in os.environ:
    # inherited, they make Lightning believe the ranks are launched externally, and rank 0 waits for a rank 1
    # that never starts
    inherited = {k: v for k, v in os.environ.items() if k not in _DIST_VARS and not k.startswith(("PL_", "TORCHELASTIC"))}
    env = {**inherited, "PYTHONPATH": pythonpath, "MASTER_PORT": str(_free_port())}
    if launcher == "ranks":
        from tests.warm_python import WarmProcess

        ranks = [WarmProcess(path=path, cwd=tmp_path, env={**env, "MASTER_ADDR": "127.0.0.1", "NODE_RANK": "0",
                                                            "LOCAL_RANK": str(r), "WORLD_SIZE": str(nprocs)})
                 for r in range(nprocs)]  # fmt: skip
        done = [rank.wait(timeout) for rank in ranks]
        for r, (code, _log) in enumerate(done):
            assert code == 0, f"DDP rank {r} failed (exit {code}):\n" + "\n".join(f"--- rank {k}:\n{text[-4000:]}"
                                                                               for k, (_, text) in enumerate(done))
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nprocs)]
    # its own process group: on a timeout every rank goes, not only the first (a rank left behind would hold its
    # port and CPUs for the tests that follow)
    proc = subprocess.Popen(
        [sys.executable, str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        import signal

        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(
            f"DDP script timed out after {timeout} s:\n{stdout[-3000:]}\n{stderr[-6000:]}"
        ) from None
    assert proc.returncode == 0, f"DDP script failed:\n{stdout[-3000:]}\n{stderr[-6000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nprocs)]


class ImageIdModel(pl.LightningModule):
    """Records the labels of every ``(images, labels)`` batch per stage (with an id source, the sample ids), and
    the images' dtype, shape and device; trains one scalar so the optimizer has work."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.seen: dict[str, list[list[int]]] = {"train": [], "val": []}
        self.images: list[tuple[str, tuple[int, ...], str]] = []

    def _record(self, stage: str, batch) -> torch.Tensor:
        images, labels = batch
        assert labels.dtype == torch.int64 and labels.ndim == 1 and labels.device == images.device
        self.seen[stage].append(labels.tolist())
        self.images.append((str(images.dtype), tuple(images.shape), images.device.type))
        return images.float().mean() * self.w

    def training_step(self, batch, batch_idx):
        return self._record("train", batch)

    def validation_step(self, batch, batch_idx):
        self._record("val", batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class IdSource:
    """Wraps a DALI sample source so that each sample's label is its index (tests check ids per epoch)."""

    def __init__(self, source) -> None:
        self.inner, self.classes = source, source.classes
        if not callable(getattr(source, "path", None)):
            self.path = None  # like its source (an LMDB pack): Python reads the records

    def __len__(self) -> int:
        return len(self.inner)

    def read(self, index: int):
        return self.inner.read(index)[0], index

    def sample_path(self, index: int) -> str:
        return self.inner.sample_path(index)

    def path(self, index: int):  # a folder source lets DALI read the files
        return self.inner.path(index)[0], index


def id_dali_datamodule(*args, **kwargs):
    """A DALIDataModule whose labels are sample ids."""
    from lightning_gpu_boost.datamodules.dali import DALIDataModule

    class IdDALIDataModule(DALIDataModule):
        def source(self, root):
            return IdSource(super().source(root))

    return IdDALIDataModule(*args, **kwargs)


class VectorDataset(Dataset):
    """``n`` samples ``(float vector of 8, id)``, each costing ``delay_s`` of sleep (a slow loader)."""

    def __init__(self, n: int = 256, delay_s: float = 0.0) -> None:
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.delay_s:
            import time

            time.sleep(self.delay_s)
        return torch.full((8,), float(i)), i


class VectorDataModule(pl.LightningDataModule):
    """A DataModule over :class:`VectorDataset` for ``lightning-gpu-boost doctor``."""

    def __init__(
        self, n: int = 256, delay_s: float = 0.0, batch_size: int = 32, num_workers: int = 0
    ) -> None:
        super().__init__()
        self.n, self.delay_s, self.batch_size, self.num_workers = n, delay_s, batch_size, num_workers

    def train_dataloader(self):
        return DataLoader(VectorDataset(self.n, self.delay_s), batch_size=self.batch_size, shuffle=True,
                          num_workers=self.num_workers)  # fmt: skip


class VectorModel(pl.LightningModule):
    """A linear model on 8-vectors; ``work`` extra matrix products per step make it compute-bound."""

    def __init__(self, work: int = 0, width: int = 512) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 2)
        self.w = nn.Parameter(torch.randn(width, width) / width**0.5)
        self.work = work

    def training_step(self, batch, batch_idx):
        x = batch[0]
        loss = self.layer(x).sum()
        h = x.new_ones(x.shape[0], self.w.shape[0])
        for _ in range(self.work):
            h = torch.tanh(h @ self.w)
        return loss + 1e-6 * h.sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


# ------------------------------------------------------------- torchvision stand-ins (torchvision is not in CI)
def _tv(cls: type, module: str) -> type:
    cls.__module__ = module
    return cls


TV_TRANSFORMS = "torchvision.transforms.transforms"


@lambda c: _tv(c, TV_TRANSFORMS)
class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


@lambda c: _tv(c, TV_TRANSFORMS)
class ToTensor:
    """torchvision's ToTensor for PIL images and HWC uint8 / float arrays."""

    def __call__(self, pic):
        import numpy as np

        arr = np.array(pic)
        x = torch.from_numpy(arr if arr.ndim == 3 else arr[:, :, None]).permute(2, 0, 1).contiguous()
        return x.float().div(255) if x.dtype == torch.uint8 else x.float()


@lambda c: _tv(c, TV_TRANSFORMS)
class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, x):
        mean, std = torch.tensor(self.mean).view(-1, 1, 1), torch.tensor(self.std).view(-1, 1, 1)
        return (x - mean) / std


@lambda c: _tv(c, TV_TRANSFORMS)
class Flip:
    def __call__(self, img):
        from PIL import Image

        return img.transpose(Image.FLIP_LEFT_RIGHT)


@lambda c: _tv(c, "torchvision.datasets.folder")
class FakeImageFolder(Dataset):
    """torchvision-style ``(transform(image), label)`` over random 8-bit PIL images."""

    def __init__(self, n: int = 12, size: int = 8, transform=None, mode: str = "RGB"):
        import numpy as np
        from PIL import Image

        rng = np.random.default_rng(0)
        channels = {"RGB": 3, "L": 1}[mode]
        self.images = [
            Image.fromarray(rng.integers(0, 256, (size, size, channels), dtype=np.uint8).squeeze(), mode)
            for _ in range(n)
        ]
        self.transform = transform
        self.produced: list = []

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        out = self.transform(self.images[i]) if self.transform else self.images[i]
        self.produced.append(getattr(out, "dtype", None))  # what the (in-process) workers produced
        return out, i % 3


class Sleeping(Dataset):
    """A map-style dataset of ``length`` batches (4 samples each), each taking ``seconds`` to load, or
    ``seconds(call)`` (``call``: 1, 2, ... over the dataset's life in this process), with no CPU used while it
    waits: the meter's and the doctor's trial-fit tests' loaders (one batch per item: ``batch_size=None``)."""

    def __init__(self, length: int, seconds) -> None:
        self.length, self.seconds, self.calls = length, seconds, 0

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        import time

        import torch

        self.calls += 1
        time.sleep(self.seconds(self.calls) if callable(self.seconds) else self.seconds)
        return torch.randn(4, 8), torch.zeros(4)


class _Collects(Dataset):
    """A dataset whose worker runs the garbage collector, as any worker's allocations may."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        import gc

        gc.collect()
        return i


def batches_beside_garbage(make) -> list:
    """The batches a DataLoader's forked worker loads while ``make()``'s object, dropped in a reference cycle with
    the collector off, waits to be collected (a worker that collects it must not hang: 30 s, then an error)."""
    import gc

    gc.disable()
    try:
        made = make()
        made.itself = made  # a cycle: unreachable once dropped, until the collector runs
        del made
        loader = DataLoader(_Collects(), batch_size=1, num_workers=1, multiprocessing_context="fork", timeout=30)
        return [b.tolist() for b in loader]
    finally:
        gc.enable()
        gc.collect()
