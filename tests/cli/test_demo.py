from __future__ import annotations

import json

from lightning_gpu_boost.cli import main


def test_demo_runs_end_to_end_and_prints_the_table(tmp_path, capsys):
    import logging

    level = logging.getLogger("lightning.pytorch").level
    rc = main(
        ["demo", "--data", str(tmp_path / "data"), "--images", "24", "--classes", "3", "--batch-size", "4",
         "--image-size", "32", "--steps", "3", "--warmup", "1", "--arch", "small_cnn", "--out", str(tmp_path)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "| plain Lightning defaults |" in out and "| GPUBoost(), the one line |" in out and "speed-up:" in out
    # run in-process, it leaves Lightning's logging as it was (it once left it at WARNING: later tests in the same
    # process lost Lightning's INFO lines, the ones some read through caplog)
    assert logging.getLogger("lightning.pytorch").level == level
    (result,) = tmp_path.glob("demo-*.json")
    data = json.loads(result.read_text())
    assert data["figures"]["plain"]["steps"] >= 3 and "halves_diff" in data["figures"]["plain"] and "speedup_vs_plain" in data["bars"]
    assert data["environment"]["torch"]
