"""ImageNet-style classification as Lightning's ImageNet example writes it: torchvision ``ImageFolder`` with
``RandomResizedCrop``, flip, ``ToTensor``, ``Normalize``; ResNet-50; ``num_workers=4``; fp32.

Expected: the loader limits it (4 workers decode JPEGs for a ResNet-50 step on an H100).
"""

from __future__ import annotations

import random
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

EXPECTED = {"cpu": "data-bound", "gpu": "data-bound"}
SIZES = {
    "cpu": {"images": 1024, "classes": 8, "pixels": (320, 240), "batch": 16, "crop": 64, "workers": 2, "steps": 30},
    "gpu": {"images": 16000, "classes": 100, "pixels": (500, 375), "batch": 256, "crop": 224, "workers": 4,
            "steps": 60},
}  # fmt: skip
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Folder(Dataset):
    """torchvision's ImageFolder + RandomResizedCrop + flip + ToTensor + Normalize (Pillow where torchvision is
    missing, as on CI)."""

    def __init__(self, root: Path, crop: int) -> None:
        self.samples = sorted((p, int(p.parent.name.split("_")[1])) for p in Path(root).glob("class_*/*.jpg"))
        self.crop = crop
        try:
            from torchvision import transforms

            self.transform = transforms.Compose([
                transforms.RandomResizedCrop(crop), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                transforms.Normalize(MEAN, STD),
            ])  # fmt: skip
        except ImportError:
            self.transform = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        img = Image.open(path).convert("RGB")
        if self.transform is not None:
            return self.transform(img), label
        w, h = img.size
        s = random.uniform(0.35, 1.0)
        cw, ch = int(w * s), int(h * s)
        x, y = random.randint(0, w - cw), random.randint(0, h - ch)
        img = img.resize((self.crop, self.crop), Image.BILINEAR, box=(x, y, x + cw, y + ch))
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255).permute(2, 0, 1)
        return (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1), label


def classifier(classes: int, gpu: bool) -> torch.nn.Module:
    if gpu:
        from torchvision.models import resnet50

        return resnet50(num_classes=classes)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(16, classes),
    )  # fmt: skip


class Classifier(pl.LightningModule):
    def __init__(self, classes: int, gpu: bool) -> None:
        super().__init__()
        self.model = classifier(classes, gpu)

    def training_step(self, batch, batch_idx):
        images, target = batch
        loss = F.cross_entropy(self.model(images), target)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        images, target = batch
        self.log("val_loss", F.cross_entropy(self.model(images), target))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)


def prepare(root: Path, size: str) -> Path:
    from _images import jpeg_tree

    cfg = SIZES[size]
    return jpeg_tree(Path(root) / f"jpeg-{cfg['images']}", cfg["images"], cfg["classes"], cfg["pixels"])


def build(data: Path, size: str):
    cfg = SIZES[size]
    loader = DataLoader(Folder(data, cfg["crop"]), batch_size=cfg["batch"], shuffle=True,
                        num_workers=cfg["workers"], pin_memory=size == "gpu")  # fmt: skip
    return Classifier(cfg["classes"], size == "gpu"), loader, None, {"max_steps": cfg["steps"]}
