"""LightningDataModules."""

from lightning_gpu_boost.datamodules.base import BoostDataModule
from lightning_gpu_boost.datamodules.image_folder import ImageFolderDataModule, ImageFolderDataset


def __getattr__(name: str):  # the LMDB classes need the `lmdb` extra: import them on first use
    if name in ("LMDBDataModule", "LMDBImageDataset", "LMDBSampleDataset"):
        from lightning_gpu_boost.datamodules import lmdb

        return getattr(lmdb, name)
    raise AttributeError(f"module 'lightning_gpu_boost.datamodules' has no attribute {name!r}")


__all__ = ["BoostDataModule", "ImageFolderDataModule", "ImageFolderDataset", "LMDBDataModule", "LMDBImageDataset",
           "LMDBSampleDataset"]  # fmt: skip
