"""Synthetic image data for the image workloads (harness, not part of the projects)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def jpeg_tree(root: Path, n: int, classes: int, size: tuple[int, int], seed: int = 0) -> Path:
    """``root/class_k/img_i.jpg``: smooth colour fields plus noise (JPEG sizes like photos of that size)."""
    done = root / ".complete"
    if done.exists():
        return root
    rng = np.random.default_rng(seed)
    w, h = size
    for i in range(n):
        folder = root / f"class_{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        small = rng.integers(0, 256, (max(2, h // 64), max(2, w // 64), 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
        noise = rng.normal(0, 12, (h, w, 3))
        arr = np.clip(np.asarray(img, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
        Image.fromarray(arr).save(folder / f"img_{i:06d}.jpg", quality=90)
    done.touch()
    return root


def image_mask_pairs(root: Path, n: int, size: int, classes: int, seed: int = 0) -> Path:
    """``root/images/i.jpg`` and ``root/masks/i.png`` (a class index per pixel: a few filled shapes)."""
    done = root / ".complete"
    if done.exists():
        return root
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        mask = Image.new("L", (size, size), 0)
        draw = ImageDraw.Draw(mask)
        img = Image.fromarray(rng.integers(0, 256, (size // 32, size // 32, 3), dtype=np.uint8)).resize(
            (size, size), Image.BICUBIC
        )
        paint = ImageDraw.Draw(img)
        for _ in range(6):
            x0, y0 = rng.integers(0, size - 32, 2)
            x1, y1 = x0 + rng.integers(16, size // 2), y0 + rng.integers(16, size // 2)
            label = int(rng.integers(1, classes))
            draw.ellipse((x0, y0, x1, y1), fill=label)
            paint.ellipse((x0, y0, x1, y1), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        img.save(root / "images" / f"{i:05d}.jpg", quality=90)
        mask.save(root / "masks" / f"{i:05d}.png")
    done.touch()
    return root
