"""Register the ``ddp_boost`` strategies with Lightning without importing Lightning (or torch) ourselves.

``import lightning_gpu_boost`` must stay light (torch imports pynvml, Lightning imports matplotlib), yet
``Trainer(strategy="ddp_boost")`` must work once the package is imported. So registration runs as soon as
``lightning.pytorch.strategies`` is loaded: at once if it already is, else right after it is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import Any

__all__ = ['install']

_TARGET = "lightning.pytorch.strategies"


def _register() -> None:
    presets = sys.modules.get("lightning_gpu_boost.strategies.presets")
    if presets is not None and not hasattr(presets, "register"):
        return  # our own import of Lightning got us here; lightning_gpu_boost.strategies registers when done
    from lightning_gpu_boost.strategies.presets import register

    register()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of ``_TARGET`` so that registration follows its execution."""

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)  # one shot; also lets the real finders answer below
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module: Any) -> None:
            exec_module(module)
            _register()

        spec.loader.exec_module = exec_then_register  # type: ignore[method-assign]
        return spec


def install() -> None:
    if _TARGET in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
