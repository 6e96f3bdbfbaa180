"""The demo and benchmark models (``models.py``): each backbone's output, uint8 inputs normalized by the model,
a clear error for an unknown arch."""

from __future__ import annotations

import pytest
import torch

from lightning_gpu_boost.models import ImageClassifier, build_backbone


@pytest.mark.parametrize("arch", ["small_cnn", "two_conv"])
def test_backbones_give_one_score_per_class(arch):
    assert build_backbone(arch, num_classes=5, width=8)(torch.randn(2, 3, 32, 32)).shape == (2, 5)


def test_uint8_and_float_inputs_train():
    model = ImageClassifier("small_cnn", num_classes=3)
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 0])
    loss_uint8 = model.training_step((images, labels), 0)
    assert torch.isfinite(loss_uint8)


def test_unknown_arch_is_named():
    with pytest.raises(ValueError, match="arch must be 'small_cnn', 'two_conv', 'resnet18' or 'resnet50', got 'vgg'"):
        build_backbone("vgg", 3)
