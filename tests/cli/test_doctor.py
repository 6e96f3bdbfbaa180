"""``lightning-gpu-boost doctor`` from class paths and from a LightningCLI YAML config."""

from __future__ import annotations

import json

import pytest

from lightning_gpu_boost.cli import main


def test_doctor_from_class_paths(tmp_path, capsys):
    rc = main(["doctor", "--data", "tests.helpers.VectorDataModule", "--data-args", '{"delay_s": 0.004}',
               "--model", "tests.helpers.VectorModel", "--accelerator", "cpu", "--budget", "6", "--steps", "5",
               "--out", str(tmp_path)])  # fmt: skip
    printed = capsys.readouterr()
    assert rc == 0 and "Bottleneck: loader" in printed.out
    assert "doctor: searching the worker count" in printed.err  # progress goes to stderr
    (out,) = tmp_path.glob("doctor-*-*.json")
    assert json.loads(out.read_text())["diagnosis"]["bottleneck"] == "loader"


def test_doctor_shares_auto_num_workers_cache_unless_told_not_to(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    args = ["doctor", "--data", "tests.helpers.VectorDataModule", "--data-args", '{"delay_s": 0.004}',
            "--accelerator", "cpu", "--budget", "3", "--no-trials"]  # fmt: skip
    assert main(args) == 0 and "from AutoNumWorkers' cache" not in capsys.readouterr().err
    assert (tmp_path / "lightning_gpu_boost" / "num_workers.json").exists()  # the tuner's own cache
    assert main(args) == 0 and "from AutoNumWorkers' cache" in capsys.readouterr().err
    assert main([*args, "--no-cache"]) == 0 and "from AutoNumWorkers' cache" not in capsys.readouterr().err


def test_doctor_from_a_lightning_cli_config(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(
        "model:\n  class_path: tests.helpers.VectorModel\n  init_args: {work: 40}\n"
        "data:\n  class_path: tests.helpers.VectorDataModule\n"
    )
    assert (
        main(["doctor", "--config", str(config), "--accelerator", "cpu", "--budget", "3", "--no-tune"]) == 0
    )
    assert "Bottleneck: compute" in capsys.readouterr().out


def test_doctor_names_a_bad_class_path(capsys):
    assert main(["doctor", "--data", "no_such_module.DataModule"]) == 2
    assert "lightning-gpu-boost: error: Cannot import 'no_such_module'" in capsys.readouterr().err
    assert main(["doctor"]) == 2
    assert "Name the DataModule" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="Name the DataModule"):
        main(["--debug", "doctor"])


def test_doctor_takes_the_config_lightning_cli_prints(tmp_path, capsys):
    """``fit --print_config`` of a script that fixes its classes (``LightningCLI(Model, DataModule)``): the sections
    hold init args alone, beside trainer, optimizer and the rest; the class comes from --data / --model."""
    from lightning.pytorch.cli import LightningCLI

    from tests.helpers import VectorDataModule, VectorModel

    with pytest.raises(SystemExit):
        LightningCLI(VectorModel, VectorDataModule, args=["fit", "--print_config", "--model.work", "40"])
    printed = capsys.readouterr().out
    assert "trainer:" in printed and "model:" in printed and "class_path" not in printed
    config = tmp_path / "config.yaml"
    config.write_text(printed)
    base = ["doctor", "--config", str(config), "--accelerator", "cpu", "--budget", "3", "--no-tune"]
    assert main(base) == 2
    assert "holds arguments but no class" in capsys.readouterr().err
    assert main([*base, "--data", "tests.helpers.VectorDataModule", "--model", "tests.helpers.VectorModel"]) == 0
    assert "Bottleneck: compute" in capsys.readouterr().out
    nested = tmp_path / "nested.yaml"  # a config with its subcommand's sections under `fit:`
    nested.write_text("fit:\n  model:\n    class_path: tests.helpers.VectorModel\n    init_args: {work: 40}\n"
                      "  data:\n    class_path: tests.helpers.VectorDataModule\n")  # fmt: skip
    assert main(["doctor", "--config", str(nested), "--accelerator", "cpu", "--budget", "3", "--no-tune"]) == 0
