"""A ViT fine-tune as timm's ``train.py`` writes it: ``timm.create_model("vit_small_patch16_224")`` (a plain-torch
ViT of the same shape where timm is missing, as on CI), timm's training transform in the workers
(``timm.data.create_transform(is_training=True, auto_augment="rand-m9-mstd0.5")``: RandomResizedCrop, flip,
RandAugment, ToTensor, Normalize; a Pillow version of it where timm is missing), label smoothing, AdamW with a
cosine schedule, bf16 autocast on the GPU, 8 workers.

Expected: the loader limits it (RandAugment's Pillow operations per image cost more CPU than a ViT-S step's GPU time).
"""

from __future__ import annotations

import random
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageEnhance, ImageOps
from torch import nn
from torch.utils.data import DataLoader, Dataset

EXPECTED = {"cpu": "data-bound", "gpu": "data-bound"}
SIZES = {
    "cpu": {"images": 512, "classes": 8, "pixels": (320, 240), "batch": 16, "crop": 64, "workers": 1, "dim": 32,
            "depth": 1, "steps": 24},
    "gpu": {"images": 12000, "classes": 100, "pixels": (500, 375), "batch": 128, "crop": 224, "workers": 8,
            "dim": 384, "depth": 12, "steps": 60},
}  # fmt: skip
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _rand_augment(img: Image.Image, n: int = 2, m: int = 9) -> Image.Image:
    """timm's rand-m9 in Pillow: ``n`` random operations at magnitude ``m`` of 10."""
    level = m / 10
    ops = [
        lambda i: ImageOps.autocontrast(i),
        lambda i: ImageOps.equalize(i),
        lambda i: i.rotate(random.uniform(-30, 30) * level, resample=Image.BILINEAR),
        lambda i: ImageOps.solarize(i, int(256 - 256 * level)),
        lambda i: ImageEnhance.Color(i).enhance(1 + random.uniform(-0.9, 0.9) * level),
        lambda i: ImageOps.posterize(i, max(1, int(8 - 4 * level))),
        lambda i: ImageEnhance.Contrast(i).enhance(1 + random.uniform(-0.9, 0.9) * level),
        lambda i: ImageEnhance.Brightness(i).enhance(1 + random.uniform(-0.9, 0.9) * level),
        lambda i: ImageEnhance.Sharpness(i).enhance(1 + random.uniform(-0.9, 0.9) * level),
        lambda i: i.transform(i.size, Image.AFFINE, (1, random.uniform(-0.3, 0.3) * level, 0, 0, 1, 0)),
    ]
    for op in random.sample(ops, n):
        img = op(img)
    return img


def augment(img: Image.Image, crop: int) -> Image.Image:
    """timm's training augmentation before ToTensor, in Pillow: RandomResizedCrop (area 8-100 %), flip, rand-m9."""
    w, h = img.size
    s = random.uniform(0.08, 1.0) ** 0.5
    cw, ch = max(8, int(w * s)), max(8, int(h * s))
    x, y = random.randint(0, w - cw), random.randint(0, h - ch)
    img = img.resize((crop, crop), Image.BICUBIC, box=(x, y, x + cw, y + ch))
    if random.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return _rand_augment(img)


class Folder(Dataset):
    """An image folder with timm's training transform (its Pillow equivalent where timm is missing)."""

    def __init__(self, root: Path, crop: int) -> None:
        self.samples = sorted((p, int(p.parent.name.split("_")[1])) for p in Path(root).glob("class_*/*.jpg"))
        self.crop = crop
        try:
            from timm.data import create_transform

            self.transform = create_transform(crop, is_training=True, auto_augment="rand-m9-mstd0.5",
                                              mean=MEAN, std=STD)  # fmt: skip
        except ImportError:
            self.transform = None

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        img = Image.open(path).convert("RGB")
        if self.transform is not None:
            return self.transform(img), label
        img = augment(img, self.crop)
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255).permute(2, 0, 1)
        return (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1), label


class ViT(nn.Module):
    """ViT-S/16's shape in plain torch (patch embedding, class token, pre-norm encoder, head)."""

    def __init__(self, crop: int, classes: int, dim: int, depth: int) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 16, stride=16)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, (crop // 16) ** 2 + 1, dim))
        layer = nn.TransformerEncoderLayer(dim, max(1, dim // 64), 4 * dim, activation="gelu", batch_first=True,
                                           norm_first=True)  # fmt: skip
        self.blocks = nn.TransformerEncoder(layer, depth)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


def vit(crop: int, classes: int, dim: int, depth: int) -> nn.Module:
    if crop == 224 and dim == 384:
        try:
            import timm

            return timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=classes)
        except ImportError:
            pass
    return ViT(crop, classes, dim, depth)


class FineTune(pl.LightningModule):
    def __init__(self, crop: int, classes: int, dim: int, depth: int, steps: int) -> None:
        super().__init__()
        self.model, self.steps = vit(crop, classes, dim, depth), steps

    def training_step(self, batch, batch_idx):
        images, target = batch
        loss = F.cross_entropy(self.model(images), target, label_smoothing=0.1)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=5e-4, weight_decay=0.05)
        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, self.steps))]


def prepare(root: Path, size: str) -> Path:
    from _images import jpeg_tree

    cfg = SIZES[size]
    return jpeg_tree(Path(root) / f"vit-jpeg-{cfg['images']}", cfg["images"], cfg["classes"], cfg["pixels"], seed=7)


def build(data: Path, size: str):
    cfg = SIZES[size]
    loader = DataLoader(Folder(data, cfg["crop"]), batch_size=cfg["batch"], shuffle=True, drop_last=True,
                        num_workers=cfg["workers"], pin_memory=size == "gpu", persistent_workers=True)  # fmt: skip
    model = FineTune(cfg["crop"], cfg["classes"], cfg["dim"], cfg["depth"], cfg["steps"])
    kwargs = {"max_steps": cfg["steps"], **({"precision": "bf16-mixed"} if size == "gpu" else {})}
    return model, loader, None, kwargs
