"""What users run today, for side-by-side comparisons: torchvision's ``ImageFolder`` with float transforms.

Where torchvision is not installed, :class:`PlainImageFolder` does the same work with Pillow: full-size decode,
random-resized crop and flip on the PIL image, conversion to float32 and normalization on the CPU.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from lightning_gpu_boost._imports import module_available
from lightning_gpu_boost.core.images import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    random_resized_crop_box,
    scan_image_folder,
)

__all__ = ['PlainImageFolder', 'plain_image_folder']


class PlainImageFolder(Dataset):
    """torchvision-free equivalent of ``ImageFolder(root, RandomResizedCrop + flip + ToTensor + Normalize)``."""

    def __init__(self, root: str | os.PathLike, image_size: int = 224) -> None:
        self.samples, self.classes, _ = scan_image_folder(root)
        self.image_size = image_size
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with Image.open(path) as img:
            img = img.convert("RGB")
        box = random_resized_crop_box(*img.size)
        img = img.resize((self.image_size, self.image_size), Image.BILINEAR, box=box)
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return (x - self.mean) / self.std, label


def plain_image_folder(root: str | os.PathLike, image_size: int = 224) -> Dataset:
    """torchvision's ``ImageFolder`` with ``RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize``
    where torchvision is installed, else :class:`PlainImageFolder`."""
    if not module_available("torchvision"):
        return PlainImageFolder(root, image_size)
    from torchvision import datasets, transforms

    transform = transforms.Compose(
        [
            transforms.RandomResizedCrop(image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )
    return datasets.ImageFolder(str(root), transform=transform)
