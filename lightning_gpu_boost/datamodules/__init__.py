"""LightningDataModules."""

from lightning_gpu_boost.datamodules.base import BoostDataModule
from lightning_gpu_boost.datamodules.image_folder import ImageFolderDataModule, ImageFolderDataset

__all__ = ["BoostDataModule", "ImageFolderDataModule", "ImageFolderDataset"]
