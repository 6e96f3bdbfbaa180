"""Registering ``ddp_boost`` (``_registration.py``): the name resolves whichever of the package and Lightning is
imported first."""

from __future__ import annotations

import pytest

from tests.fresh_python import run_fresh


@pytest.mark.parametrize("order", ["package first", "lightning first"])
def test_ddp_boost_resolves_once_the_package_is_imported(order):
    imports = ["import lightning_gpu_boost", "from lightning.pytorch import Trainer"]
    if order == "lightning first":
        imports.reverse()
    code = "; ".join(
        [*imports, "t = Trainer(strategy='ddp_boost', accelerator='cpu', devices=1, logger=False)",
         "assert type(t.strategy).__name__ == 'DDPBoostStrategy', t.strategy"]
    )  # fmt: skip
    status, output = run_fresh(code)  # neither the package nor Lightning imported before (tests/fresh_python.py)
    assert status == 0, output
