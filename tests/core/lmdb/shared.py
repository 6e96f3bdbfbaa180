"""Helpers shared by the pack tests."""

from __future__ import annotations

import pytest

pytest.importorskip("lmdb")
pytest.importorskip("msgpack")

from lightning_gpu_boost.core import lmdb as lf


def _records(path):
    reader = lf.PackReader(path)
    return [reader.read(i, lambda r: (bytes(r.payload), r.label)) for i in range(len(reader))]
