"""move_normalize (``core/move_normalize.py``): a torchvision dataset's ToTensor + Normalize moved out of the
workers (uint8 out, the same floats after GPUNormalize), grayscale and non-8-bit inputs, other datasets left alone."""

from __future__ import annotations

from collections import namedtuple

import torch
from torch.utils.data import DataLoader

from lightning_gpu_boost.core.prefetch import GPUNormalize
from tests.helpers import IndexDataset

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
Pair = namedtuple("Pair", ["x", "y"])


def _imagenet_tf():
    from tests.helpers import Compose, Flip, Normalize, ToTensor

    return Compose([Flip(), ToTensor(), Normalize(MEAN, STD)])


def test_move_normalize_gives_uint8_that_normalize_on_device_to_the_same_floats():

    from lightning_gpu_boost.core.move_normalize import Uint8Transform, move_normalize, restore_normalize
    from tests.helpers import FakeImageFolder

    ds = FakeImageFolder(transform=_imagenet_tf())
    original = ds.transform
    expected = next(iter(DataLoader(ds, batch_size=6)))
    assert move_normalize(ds) == (MEAN, STD)
    assert isinstance(ds.transform, Uint8Transform) and "Normalize" in repr(ds.transform)
    assert move_normalize(ds) == (MEAN, STD)  # idempotent: a second loader over the same dataset
    x, y = next(iter(DataLoader(ds, batch_size=6)))
    assert x.dtype == torch.uint8 and x.shape == expected[0].shape
    out = GPUNormalize(*move_normalize(ds), key=0)([x, y])
    torch.testing.assert_close(out[0], expected[0], atol=1e-6, rtol=0)
    assert torch.equal(out[1], expected[1])
    restore_normalize(ds)
    assert ds.transform is original


def test_move_normalize_leaves_other_datasets_and_transforms_alone():
    from torch.utils.data import Subset

    from lightning_gpu_boost.core.move_normalize import move_normalize
    from tests.helpers import Compose, FakeImageFolder, ToTensor

    plain = IndexDataset(4)
    plain.transform = _imagenet_tf()
    assert move_normalize(plain) is None  # not a torchvision dataset: its batch layout is unknown
    no_norm = FakeImageFolder(transform=Compose([ToTensor()]))
    assert move_normalize(no_norm) is None and isinstance(no_norm.transform, Compose)
    assert move_normalize(FakeImageFolder(transform=None)) is None
    wrapped = FakeImageFolder(transform=_imagenet_tf())
    assert move_normalize(Subset(wrapped, [0, 1])) == (MEAN, STD)  # under Subset


def test_move_normalize_grayscale_and_non_8bit_inputs():
    import numpy as np

    from lightning_gpu_boost.core.move_normalize import move_normalize
    from tests.helpers import Compose, FakeImageFolder, Normalize, ToTensor

    gray = FakeImageFolder(mode="L", transform=Compose([ToTensor(), Normalize((0.5,), (0.25,))]))
    assert move_normalize(gray) == ((0.5,), (0.25,))
    x, _ = gray[0]
    assert x.dtype == torch.uint8 and x.shape == (1, 8, 8)
    floats = np.random.default_rng(0).random((4, 4, 3)).astype(np.float32)
    # not an 8-bit image: the original ToTensor + Normalize run, as before
    torch.testing.assert_close(
        gray.transform(floats[:, :, :1]), (torch.from_numpy(floats[:, :, :1]).permute(2, 0, 1) - 0.5) / 0.25
    )
