"""Optional dependencies (``_imports.py``): found without importing them; a missing one names its extra."""

from __future__ import annotations

import pytest


def test_missing_optional_dependency_names_the_extra(monkeypatch):
    from lightning_gpu_boost import _imports

    def missing(name):
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(_imports.importlib, "import_module", missing)
    with pytest.raises(ImportError, match=r"pip install 'lightning-gpu-boost\[nvml\]'"):
        _imports.require("pynvml")
    with pytest.raises(ImportError, match=r"dali-cuda13"):
        _imports.require("nvidia.dali")


def test_module_available_never_imports():
    import sys

    from lightning_gpu_boost._imports import module_available

    assert module_available("json") and not module_available("no_such_module_here")
    assert not module_available("no_such_package.sub")  # a missing parent is an answer, not an error
    assert "this_is_not_imported" not in sys.modules
