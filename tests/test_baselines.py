"""The plain-Lightning baseline (``baselines.py``): torchvision's ImageFolder pipeline, or its torchvision-free
equivalent, giving normalized float images of the asked size."""

from __future__ import annotations

import torch

from lightning_gpu_boost.baselines import PlainImageFolder, plain_image_folder


def test_both_baselines_give_normalized_floats_of_the_asked_size(jpeg_tree):
    for dataset in (PlainImageFolder(jpeg_tree, image_size=32), plain_image_folder(jpeg_tree, image_size=32)):
        image, label = dataset[0]
        assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and isinstance(label, int)
        assert image.min() < 0 < image.max()  # mean/std normalized
        assert len(dataset) == 24
