"""``pack`` and ``verify`` from the command line."""

from __future__ import annotations


def test_a_pack_that_keeps_no_record_fails_and_verify_says_not_ok(tmp_path, capsys):
    from lightning_gpu_boost.cli import main

    tree = tmp_path / "src"
    (tree / "cats").mkdir(parents=True)
    (tree / "cats" / "a.jpg").write_bytes(b"not an image")
    assert main(["pack", str(tree), str(tmp_path / "p.lmdb")]) == 1
    assert "keeps no record" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "p.lmdb")]) == 1
    assert "holds no record" in capsys.readouterr().out
