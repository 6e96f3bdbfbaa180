"""Where the GPU's JPEG engines are not there, the GPU decode says why and nvJPEG decodes (the engines themselves
run in test_on_gpu.py)."""

from __future__ import annotations

import sys

import torch

from lightning_gpu_boost.core.gpu_decode.engines import open_engines


def test_no_engines_off_cuda():
    assert open_engines(torch.device("cpu")) == (None, "not a CUDA device")


def test_a_missing_nvimagecodec_names_its_wheel(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # import fails
    engines, why = open_engines(torch.device("cuda", 0))
    assert engines is None and "pip install 'lightning-gpu-boost[gpu-decode-cuda13]'" in why


def test_the_engines_argument_is_checked_and_named():
    import pytest

    from lightning_gpu_boost.core.gpu_decode import BatchDecoder, SplitSearch

    with pytest.raises(ValueError, match="engines must be True or False, got 'yes'"):
        BatchDecoder((0.5,), (0.5,), engines="yes")
    assert "engines=False" in BatchDecoder((0.5,), (0.5,), engines=False).decoder_name
    with pytest.raises(ValueError, match="max_breaks must be >= 0, got -1"):
        SplitSearch(max_breaks=-1)
    with pytest.raises(ValueError, match=r"headroom must be in \[0, 1\), got 1.5"):
        SplitSearch(headroom=1.5)
