"""Registering ``ddp_boost`` (``_registration.py``): the name resolves whichever of the package and Lightning is
imported first."""

from __future__ import annotations

import subprocess
import sys

import pytest


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
