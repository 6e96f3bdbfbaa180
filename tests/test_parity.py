"""The same inputs everywhere: a CPU run and a GPU run hand ``training_step`` / ``validation_step`` the same dtype and
values (within float tolerance), whoever normalizes (the DataModule after the transfer, StreamPrefetch on the GPU's
side stream, or StreamPrefetch on the CPU where there is no CUDA)."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_gpu_boost.callbacks import GPUBoost, StreamPrefetch
from lightning_gpu_boost.core.images import IMAGENET_MEAN, IMAGENET_STD
from lightning_gpu_boost.datamodules import ImageFolderDataModule, LMDBDataModule


class Inputs(pl.LightningModule):
    """Keeps the images of every validation batch and the dtype of every training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.val: list[torch.Tensor] = []
        self.train_dtypes: set[str] = set()

    def training_step(self, batch, batch_idx):
        self.train_dtypes.add(str(batch[0].dtype))
        return batch[0].float().mean() * self.w

    def validation_step(self, batch, batch_idx):
        self.val.append(batch[0].detach().float().cpu())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(datamodule, accelerator="cpu", callbacks=(), **kwargs):
    model = Inputs()
    pl.Trainer(accelerator=accelerator, devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
               callbacks=list(callbacks), **kwargs).fit(model, datamodule=datamodule)  # fmt: skip
    return model


def _expected(datamodule) -> list[torch.Tensor]:
    """The validation batches normalized by hand from the loader's uint8 images (``datamodule`` made with
    ``normalize=None``: a loader made outside a Trainer otherwise normalizes in its workers)."""
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return [(images.float() / 255 - mean) / std for images, _ in datamodule.val_dataloader()]


@pytest.fixture
def pack(jpeg_tree, tmp_path):
    pytest.importorskip("lmdb")
    from lightning_gpu_boost.core.lmdb import pack_image_folder

    return str(pack_image_folder(jpeg_tree, tmp_path / "tree.lmdb", progress=False))


def _source(kind: str, jpeg_tree, request) -> tuple[type, str]:
    """A case's DataModule class and root; the pack is built only for the lmdb case, so the folder case runs where
    lmdb is not installed."""
    if kind == "folder":
        return ImageFolderDataModule, str(jpeg_tree)
    return LMDBDataModule, request.getfixturevalue("pack")


@pytest.mark.parametrize("kind", ["folder", "lmdb"])
def test_on_cpu_the_image_datamodules_hand_the_step_normalized_floats(kind, jpeg_tree, request):
    cls, root = _source(kind, jpeg_tree, request)
    make = lambda **kw: cls(root, val_root=root, image_size=32, batch_size=8, num_workers=0, **kw)  # noqa: E731
    model = _fit(make())
    assert model.train_dtypes == {"torch.float32"}
    for got, want in zip(model.val, _expected(make(normalize=None)), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("callbacks", [lambda: [StreamPrefetch(normalize=(IMAGENET_MEAN, IMAGENET_STD))],
                                       lambda: [GPUBoost(auto_workers=False, watchdog=False)]])  # fmt: skip
def test_on_cpu_the_prefetcher_parts_normalize_as_a_gpu_run_would(callbacks, jpeg_tree):
    make = lambda **kw: ImageFolderDataModule(str(jpeg_tree), val_root=str(jpeg_tree), image_size=32, batch_size=8,  # noqa: E731
                                              num_workers=0, **kw)  # fmt: skip
    model = _fit(make(), callbacks=callbacks())
    for got, want in zip(model.val, _expected(make(normalize=None)), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_stream_prefetch_normalizes_a_plain_loader_on_cpu(caplog):
    images = torch.randint(0, 256, (8, 3, 4, 4), dtype=torch.uint8)
    loader = DataLoader(TensorDataset(images, torch.zeros(8, dtype=torch.long)), batch_size=4)

    class Model(Inputs):
        def train_dataloader(self):
            return loader

        def val_dataloader(self):
            return loader

    model = Model()
    with caplog.at_level("INFO"):
        pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                   callbacks=[StreamPrefetch(normalize=(IMAGENET_MEAN, IMAGENET_STD))]).fit(model)  # fmt: skip
    assert model.train_dtypes == {"torch.float32"} and model.val[0].dtype == torch.float32
    assert "no-op" not in caplog.text


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["folder", "lmdb"])
def test_gpu_and_cpu_runs_hand_the_step_the_same_values(kind, jpeg_tree, request):
    cls, root = _source(kind, jpeg_tree, request)
    make = lambda: cls(root, val_root=root, image_size=32, batch_size=8, num_workers=0)  # noqa: E731
    cpu = _fit(make())
    for callbacks in ([], [GPUBoost(auto_workers=False, watchdog=False, channels_last=False)]):
        gpu = _fit(make(), accelerator="gpu", callbacks=callbacks)
        assert gpu.train_dtypes == cpu.train_dtypes == {"torch.float32"}
        for got, want in zip(gpu.val, cpu.val, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
