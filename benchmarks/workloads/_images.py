"""Synthetic data for the workloads (harness, not part of the projects): image trees, image/mask pairs, and
:func:`write_once`, which the audio workloads' generators use too."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw


def write_once(root: Path, write: Callable[[Any], None], jobs: Callable[[], list]) -> Path:
    """Run ``write`` over ``jobs()`` in one process per core, once: ``root/.complete`` marks a finished set (an
    interrupted one is written again)."""
    done = root / ".complete"
    if done.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    todo, cpus = jobs(), os.cpu_count() or 1
    with multiprocessing.Pool(min(len(todo), cpus)) as pool:
        pool.map(write, todo, chunksize=max(1, len(todo) // (8 * cpus)))
    done.touch()
    return root


def _jpeg(job: tuple[str, int, int, int, int | None]) -> None:
    path, seed, w, h, label = job
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(2, h // 64), max(2, w // 64), 3), dtype=np.uint8)
    if label is not None:  # half of the field is the class's own colour
        hue = np.random.default_rng(label).integers(0, 256, 3)
        small = (small.astype(np.float32) * 0.5 + hue * 0.5).astype(np.uint8)
    img = Image.fromarray(small).resize((w, h), Image.BICUBIC)
    # float32 draws and sums: a 1600 x 1200 photo in about half the CPU time of float64's (the test suite writes
    # the CPU-size data on a 2-CPU machine), the same field and noise level
    arr = rng.standard_normal((h, w, 3), dtype=np.float32)
    arr *= 12
    arr += np.asarray(img, dtype=np.float32)
    arr = np.clip(arr, 0, 255, out=arr).astype(np.uint8)
    Image.fromarray(arr).save(path, quality=90)


def jpeg_tree(
    root: Path, n: int, classes: int, size: tuple[int, int], seed: int = 0, class_colour: bool = False
) -> Path:
    """``root/class_k/img_i.jpg``: smooth colour fields plus noise (JPEG sizes like photos of that size), written
    by one process per core. ``class_colour``: half of each field is its class's colour, so that a short run's loss
    falls (and two runs' loss curves can be compared)."""

    def jobs() -> list:
        todo = []
        for i in range(n):
            folder = root / f"class_{i % classes:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            todo.append((str(folder / f"img_{i:06d}.jpg"), seed * 1_000_003 + i, *size,
                         i % classes if class_colour else None))  # fmt: skip
        return todo

    return write_once(root, _jpeg, jobs)


def _pair(job: tuple[Path, int, int, int, int]) -> None:
    root, i, size, classes, seed = job
    rng = np.random.default_rng(seed * 1_000_003 + i)
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


def image_mask_pairs(root: Path, n: int, size: int, classes: int, seed: int = 0) -> Path:
    """``root/images/i.jpg`` and ``root/masks/i.png`` (a class index per pixel: a few filled shapes), written by one
    process per core."""

    def jobs() -> list:
        (root / "images").mkdir(parents=True, exist_ok=True)
        (root / "masks").mkdir(parents=True, exist_ok=True)
        return [(root, i, size, classes, seed) for i in range(n)]

    return write_once(root, _pair, jobs)
