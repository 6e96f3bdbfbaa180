"""The command line's front door: ``--version``, one-line user errors, ``--debug`` anywhere on the line."""

from __future__ import annotations

import pytest


def test_version_and_debug_anywhere(capsys):
    from lightning_gpu_boost.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and "lightning-gpu-boost " in capsys.readouterr().out
    assert main(["pack", "/no/such/tree", "/tmp/never.lmdb"]) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line, no traceback
    with pytest.raises(FileNotFoundError):
        main(["pack", "/no/such/tree", "/tmp/never.lmdb", "--debug"])  # --debug after the subcommand


def _error(capsys, argv) -> str:
    """Run ``argv``; it must end with exit 2 and one line on stderr, which is returned."""
    from lightning_gpu_boost.cli import main

    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse's own refusal
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, (code, err)
    return err


@pytest.mark.parametrize(
    "argv, match",
    [
        (["bench", "--batch-size", "0"], "argument --batch-size: must be an int >= 1, got 0"),
        (["bench", "--workers-budget", "-1"], "must be a number > 0, got -1"),
        (["bench", "--images", "3", "--classes", "4"], "--images 3 is fewer than --classes 4"),
        (["bench", "--out", "/proc/lgb-x"], "--out '/proc/lgb-x' must be a folder that can be made and written"),
        (["demo", "--steps", "0"], "argument --steps: must be an int >= 1, got 0"),
        (["demo", "--image-size", "-1"], "argument --image-size: must be an int >= 16, got -1"),
        (["demo", "--images", "50"], "--images 50 is fewer than --classes 100"),
        (["pack", "SRC", "/tmp/x.lmdb", "--workers", "-1"], "argument --workers: must be an int >= 0, got -1"),
        (["pack", "SRC", "/tmp/x.lmdb", "--shuffle-seed", str(2**70)], "argument --shuffle-seed: must be an int in"),
        (["doctor", "--budget", "0"], "argument --budget: must be a number > 0"),
        (["doctor", "--data", "x.Y", "--precision", "bogus"], "--precision must be one of .*bf16-mixed.*got 'bogus'"),
        (["doctor", "--data", "lightning_gpu_boost.datamodules.ImageFolderDataModule", "--data-args", '{"nope": 1}'],
         "--data-args .* do not fit .*ImageFolderDataModule.*train_root"),
        (["doctor", "--data", "lightning_gpu_boost.datamodules.ImageFolderDataModule", "--data-args", "{nope"],
         "--data-args must be a JSON object"),
        (["doctor", "--data", "lightning_gpu_boost.models.ImageClassifier"],
         "must be a LightningDataModule; it is a LightningModule: pass it as --model"),
    ],
)
def test_user_errors_are_one_line_exit_2_before_any_work(capsys, tmp_path, monkeypatch, argv, match):
    import re

    monkeypatch.chdir(tmp_path)
    argv = [str(tmp_path / "src") if a == "SRC" else a for a in argv]
    assert re.search(match, _error(capsys, argv))
    assert not list(tmp_path.iterdir())  # nothing generated, nothing left behind


def test_a_gpu_asked_for_on_a_machine_without_one_is_named(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "--accelerator gpu asks for a CUDA GPU" in _error(capsys, ["doctor", "--data", "a.B", "--accelerator", "gpu"])


def test_doctor_imports_the_users_project_from_the_current_folder(tmp_path, monkeypatch, capsys):
    import sys

    (tmp_path / "myproj_lgb").mkdir()
    (tmp_path / "myproj_lgb" / "__init__.py").write_text("")
    (tmp_path / "myproj_lgb" / "data.py").write_text("class NotData:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    err = _error(capsys, ["doctor", "--data", "myproj_lgb.data.NotData"])
    assert "myproj_lgb.data.NotData must be a LightningDataModule; it is neither" in err  # found and imported
