from __future__ import annotations

import doctest
import importlib
import subprocess
import sys

import pytest


def test_import_is_light():
    code = (
        "import lightning_gpu_boost, sys; "
        "heavy = {'nvidia.dali', 'lmdb', 'pynvml', 'matplotlib'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("order", ["package first", "lightning first"])
def test_ddp_boost_resolves_once_the_package_is_imported(order):
    imports = ["import lightning_gpu_boost", "from lightning.pytorch import Trainer"]
    if order == "lightning first":
        imports.reverse()
    code = "; ".join(
        [*imports, "t = Trainer(strategy='ddp_boost', accelerator='cpu', devices=1, logger=False)",
         "assert type(t.strategy).__name__ == 'DDPBoostStrategy', t.strategy"]
    )  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


@pytest.mark.parametrize("name", ["recommended_precision", "GPUBoost", "DDPBoostStrategy", "StreamPrefetch"])
def test_each_public_name_resolves_first_in_a_fresh_process(name):
    code = f"import lightning_gpu_boost as l; l.{name}; from lightning.pytorch.strategies import StrategyRegistry; "
    code += "assert 'ddp_boost' in StrategyRegistry"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_public_names_resolve():
    import lightning_gpu_boost

    for name in lightning_gpu_boost.__all__:
        assert getattr(lightning_gpu_boost, name) is not None


def test_missing_optional_dependency_names_the_extra(monkeypatch):
    from lightning_gpu_boost import _imports

    def missing(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(_imports.importlib, "import_module", missing)
    with pytest.raises(ImportError, match=r"pip install 'lightning-gpu-boost\[nvml\]'"):
        _imports.require("pynvml")
    with pytest.raises(ImportError, match=r"dali-cuda13"):
        _imports.require("nvidia.dali")


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
    ],
)
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
