"""Fixtures of the pack tests: a small JPEG tree."""

from __future__ import annotations

import pytest

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")

from lightning_gpu_boost.core.images import make_jpeg_folder


@pytest.fixture
def tree(tmp_path):
    return make_jpeg_folder(
        tmp_path / "src", n=24, num_classes=3, size_range=(64, 80, 48, 64), workers=2, progress=False
    )
