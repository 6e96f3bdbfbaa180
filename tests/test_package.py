from __future__ import annotations

import doctest
import importlib
import subprocess
import sys

import pytest


def test_import_is_light():
    """A fresh interpreter: ``tests/fresh_python.py``'s preloaded ``torch._dynamo`` imports pynvml."""
    code = (
        "import lightning_gpu_boost, sys; "
        "heavy = {'nvidia.dali', 'lmdb', 'pynvml', 'matplotlib', 'litdata', 'boto3'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", ["recommended_precision", "GPUBoost", "DDPBoostStrategy", "StreamPrefetch"])
def test_each_public_name_resolves_first_in_a_fresh_process(name):
    """In a process that has imported neither Lightning nor the package (``tests/fresh_python.py``)."""
    from tests.fresh_python import run_fresh

    code = f"import lightning_gpu_boost as l; l.{name}; from lightning.pytorch.strategies import StrategyRegistry; "
    code += "assert 'ddp_boost' in StrategyRegistry"
    status, output = run_fresh(code)
    assert status == 0, output


def test_public_names_resolve():
    import lightning_gpu_boost

    for name in lightning_gpu_boost.__all__:
        assert getattr(lightning_gpu_boost, name) is not None


def test_module_entry_point():
    out = subprocess.run(
        [sys.executable, "-m", "lightning_gpu_boost", "--help"], capture_output=True, text=True, check=True
    )
    assert "demo" in out.stdout


@pytest.mark.parametrize(
    "module",
    [
        "lightning_gpu_boost.core.prefetch",
        "lightning_gpu_boost.core.nvml",
        "lightning_gpu_boost.datamodules.base",
        "lightning_gpu_boost.datamodules.image_folder",
        "lightning_gpu_boost.datamodules.lmdb",
        "lightning_gpu_boost.callbacks.stream_prefetch",
        "lightning_gpu_boost.callbacks.auto_num_workers",
        "lightning_gpu_boost.callbacks.gpu_util_watchdog",
        "lightning_gpu_boost.callbacks.gpu_boost",
        "lightning_gpu_boost.strategies.presets",
        "lightning_gpu_boost.core.workers",
        "lightning_gpu_boost.core.resume",
        "lightning_gpu_boost.core.run_record",
        "lightning_gpu_boost.core.mfu",
        "lightning_gpu_boost.callbacks.bad_samples",
        "lightning_gpu_boost.datamodules.streaming",
    ],
)
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_result_files_name_the_gpu_count(monkeypatch):
    import torch

    from lightning_gpu_boost.core import results

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert results.gpu_tag() == "2xh200"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert results.gpu_tag() == "h200"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert results.gpu_tag() == "cpu"


def test_merged_results_are_named_after_the_machine_that_measured():
    from lightning_gpu_boost.core.results import gpu_tag

    assert gpu_tag({"gpu": "NVIDIA H200", "gpu_count": 2}) == "2xh200"
    assert gpu_tag({"gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1}) == "h100"
    assert gpu_tag({"gpu": None, "gpu_count": 0}) == "cpu"
