from __future__ import annotations

import os
import random

import pytest
import torch
from PIL import Image

from lightning_gpu_boost.core import images
from lightning_gpu_boost.core.images import (
    center_crop_box,
    decode_center_crop,
    decode_random_resized_crop,
    make_jpeg_folder,
    random_resized_crop_box,
    scan_image_folder,
)


def test_random_resized_crop_box_stays_inside():
    rng = random.Random(0)
    for _ in range(200):
        left, top, right, bottom = random_resized_crop_box(500, 375, rng=rng)
        assert 0 <= left < right <= 500 and 0 <= top < bottom <= 375
        area = (right - left) * (bottom - top) / (500 * 375)
        assert 0.07 <= area <= 1.0


def test_center_crop_box_is_centered():
    assert center_crop_box(400, 200, 100, 200) == (150.0, 50.0, 250.0, 150.0)


def test_decode_outputs_uint8_chw(jpeg_tree):
    path = scan_image_folder(jpeg_tree)[0][0][0]
    out = decode_random_resized_crop(path, 32, rng=random.Random(1))
    assert out.dtype == torch.uint8 and tuple(out.shape) == (3, 32, 32)
    out = decode_center_crop(path, 48)
    assert out.dtype == torch.uint8 and tuple(out.shape) == (3, 48, 48)


def test_draft_decodes_at_reduced_scale_and_stays_close(tmp_path, monkeypatch):
    big = tmp_path / "big.jpg"
    images._synthetic_jpeg(str(big), 3, (800, 800, 600, 600), 90)
    sizes = []
    original = images._draft_for_box

    def spy(img, box, size):
        scaled = original(img, box, size)
        sizes.append(img.size)
        return scaled

    monkeypatch.setattr(images, "_draft_for_box", spy)
    fast = decode_center_crop(big, 64).float()
    assert sizes[-1][0] <= 200  # 1/4 or 1/8 DCT scale instead of 800 px
    with Image.open(big) as img:
        full = img.convert("RGB").resize((64, 64), Image.BILINEAR, box=center_crop_box(800, 600, 64, 73))
    full = torch.from_numpy(__import__("numpy").array(full)).permute(2, 0, 1).float()
    assert (fast - full).abs().mean() < 6  # same picture, up to resampling


def test_scan_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        scan_image_folder(tmp_path / "missing")
    with pytest.raises(ValueError, match="has no class folders"):
        scan_image_folder(tmp_path)
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="holds no image"):
        scan_image_folder(tmp_path)


def test_scan_counts_ignored_files_and_orders_deterministically(jpeg_tree, tmp_path):
    samples, classes, ignored = scan_image_folder(jpeg_tree)
    assert classes == ["class_000", "class_001", "class_002"] and ignored == 0
    assert len(samples) == 24 and samples == sorted(samples, key=lambda s: (s[1], s[0]))


def test_make_jpeg_folder_is_deterministic_and_cached(tmp_path):
    a = make_jpeg_folder(
        tmp_path / "a", n=6, num_classes=2, size_range=(64, 80, 48, 64), workers=1, progress=False
    )
    b = make_jpeg_folder(
        tmp_path / "b", n=6, num_classes=2, size_range=(64, 80, 48, 64), workers=1, progress=False
    )
    files = sorted(p.relative_to(a) for p in a.rglob("*.jpg"))
    assert len(files) == 6
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    mtime = os.path.getmtime(a / files[0])
    make_jpeg_folder(
        tmp_path / "a", n=6, num_classes=2, size_range=(64, 80, 48, 64), workers=1, progress=False
    )
    assert os.path.getmtime(a / files[0]) == mtime


def test_make_jpeg_folder_default_size_is_imagenet_like(tmp_path):
    root = make_jpeg_folder(tmp_path, n=4, num_classes=2, workers=1, progress=False)
    for path in root.rglob("*.jpg"):
        with Image.open(path) as img:
            assert 400 <= img.size[0] <= 560 and 320 <= img.size[1] <= 440
        assert 30_000 < path.stat().st_size < 160_000


def test_make_jpeg_folder_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="n >= num_classes"):
        make_jpeg_folder(tmp_path, n=2, num_classes=3)
