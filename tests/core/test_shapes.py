from __future__ import annotations

import pytest
import torch

from lightning_gpu_boost.core.shapes import ShapeWatch, shape_signature


def test_signature_walks_nested_batches():
    batch = {"x": torch.zeros(2, 3), "rest": [torch.zeros(4), (torch.zeros(1, 1), "name")]}
    assert shape_signature(batch) == ((2, 3), (4,), (1, 1))


def test_fixed_shapes_stay_fixed_and_variable_ones_are_named_once():
    watch = ShapeWatch(limit=2)
    assert not any(watch.see((torch.zeros(8, 3), torch.zeros(8))) for _ in range(10))
    assert not watch.see((torch.zeros(5, 3), torch.zeros(5)))  # an epoch's last, short batch
    assert not watch.variable
    assert watch.see((torch.zeros(8, 7), torch.zeros(8)))  # a third shape: variable
    assert watch.variable and not watch.see((torch.zeros(8, 9), torch.zeros(8)))  # said once


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_bad_limit(limit):
    with pytest.raises(ValueError, match="limit must be an int >= 1"):
        ShapeWatch(limit=limit)
