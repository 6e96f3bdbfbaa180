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
