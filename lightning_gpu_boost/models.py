"""Small LightningModules used by the demo, the benchmarks and the tests."""

from __future__ import annotations

from typing import Literal

import lightning.pytorch as pl
import torch
from torch import nn

from lightning_gpu_boost.core.images import IMAGENET_MEAN, IMAGENET_STD
from lightning_gpu_boost.core.prefetch import GPUNormalize

__all__ = ['Arch', 'ImageClassifier', 'build_backbone']

Arch = Literal["small_cnn", "two_conv", "resnet18", "resnet50"]


def build_backbone(arch: Arch, num_classes: int, width: int = 64) -> nn.Module:
    """``small_cnn``: a tiny CNN for CPUs; ``two_conv``: two full-resolution convolutions (a light, memory-bound
    GPU model); ``resnet18``, ``resnet50``: torchvision's ResNet-18 (the default of Lightning's ImageNet example) and
    ResNet-50."""
    if arch in ("resnet18", "resnet50"):
        from lightning_gpu_boost._imports import require

        return getattr(require("torchvision").models, arch)(num_classes=num_classes)
    if arch == "two_conv":
        return nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes),
        )  # fmt: skip
    if arch == "small_cnn":
        return nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=4, padding=2), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
        )  # fmt: skip
    raise ValueError(f"arch must be 'small_cnn', 'two_conv', 'resnet18' or 'resnet50', got {arch!r}.")


class ImageClassifier(pl.LightningModule):
    """Image classifier trained with SGD + momentum. Accepts float images, or uint8 images that it normalizes
    itself (ImageNet mean/std) on whatever device the batch is on.

    Args:
        arch: backbone, see :func:`build_backbone`.
        num_classes: output classes.
        lr: SGD learning rate.
        channels_last: convert the model and inputs to ``channels_last``.
        width: channels of the ``two_conv`` model.
    """

    def __init__(
        self,
        arch: Arch = "small_cnn",
        num_classes: int = 10,
        lr: float = 0.05,
        channels_last: bool = False,
        width: int = 64,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = build_backbone(arch, num_classes, width)
        self.channels_last = channels_last
        if channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self._normalize = GPUNormalize(IMAGENET_MEAN, IMAGENET_STD, channels_last=channels_last)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = self._normalize.tensor(x)
        elif self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", self.loss(self(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self(batch[0]).argmax(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
