"""LightningDataModules."""

from lightning_gpu_boost.datamodules.base import BoostDataModule
from lightning_gpu_boost.datamodules.image_folder import ImageFolderDataModule, ImageFolderDataset


def __getattr__(name: str):  # the LMDB classes need the `lmdb` extra: import them on first use
    if name in ("LMDBDataModule", "LMDBImageDataset", "LMDBSampleDataset"):
        from lightning_gpu_boost.datamodules import lmdb

        return getattr(lmdb, name)
    if name == "StreamingDataModule":  # litdata (the `stream` extra) is imported when a loader is built
        from lightning_gpu_boost.datamodules.streaming import StreamingDataModule

        return StreamingDataModule
    if name == "DALIDataModule":  # imports DALI only when a pipeline is built, but keep the module off the import path
        from lightning_gpu_boost.datamodules.dali import DALIDataModule

        return DALIDataModule
    raise AttributeError(f"module 'lightning_gpu_boost.datamodules' has no attribute {name!r}")


__all__ = ["BoostDataModule", "DALIDataModule", "ImageFolderDataModule", "ImageFolderDataset", "LMDBDataModule", "LMDBImageDataset",
           "LMDBSampleDataset", "StreamingDataModule"]  # fmt: skip
