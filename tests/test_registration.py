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


@pytest.mark.parametrize("flag", [
    ["--trainer.strategy.class_path", "lightning_gpu_boost.strategies.DDPBoostStrategy"],  # no import of ours needed
    ["--trainer.strategy", "lightning_gpu_boost.strategies.DDPBoostStrategy",  # the flat form: once imported
     "--trainer.callbacks+=lightning_gpu_boost.GPUBoost"],
    ["--trainer.strategy", "ddp_boost", "--trainer.callbacks+=lightning_gpu_boost.callbacks.GPUUtilWatchdog"],
], ids=["class_path", "flat_class_path", "name"])
def test_lightningcli_builds_ddp_boost_from_the_command_line(flag):
    """Issue 64: LightningCLI builds the preset from its command line in a fresh process (a script that imports only
    Lightning): by class path always, by the flat class path or the name once a class of ours in the config imported
    the package."""
    code = "; ".join([
        "import sys",
        "from lightning.pytorch.cli import LightningCLI",
        "from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel",
        f"sys.argv = ['train.py', *{flag!r}, '--trainer.accelerator=cpu', '--trainer.devices=1', "
        "'--trainer.logger=false']",
        "cli = LightningCLI(BoringModel, BoringDataModule, run=False)",
        "assert type(cli.trainer.strategy).__name__ == 'DDPBoostStrategy', cli.trainer.strategy",
    ])  # fmt: skip
    status, output = run_fresh(code)
    assert status == 0, output[-3000:]
