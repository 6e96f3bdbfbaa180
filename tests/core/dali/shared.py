"""Helpers shared by the DALI tests: a DALILoader on a real DALI CPU pipeline (device_id=None)."""

from __future__ import annotations

import functools

import pytest

from lightning_gpu_boost.core.dali import (
    DALILoader,
    FolderSource,
    classification_graph,
)
from tests.helpers import IdSource

pytest.importorskip("nvidia.dali", reason="needs the `dali` extra")


def loader(
    root, batch_size=4, train=True, dtype="float32", channels_last=False, normalize="imagenet", **kwargs
):
    extra = {} if normalize == "imagenet" else {"normalize": normalize}
    graph = functools.partial(
        classification_graph, train=train, gpu=False, image_size=16, dtype=dtype, channels_last=channels_last,
        **extra,
    )  # fmt: skip
    return DALILoader(
        IdSource(FolderSource(root)), graph, batch_size, num_threads=1, read_threads=2, dtype=dtype,
        channels_last=channels_last, **kwargs,
    )  # fmt: skip
