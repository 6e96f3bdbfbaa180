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
