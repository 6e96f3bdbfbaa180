"""``lightning-gpu-boost bench`` end to end on a tiny CPU configuration."""

from __future__ import annotations

import json

from lightning_gpu_boost.cli import main


def test_bench_runs_every_case_and_writes_json_markdown_and_chart(tmp_path, capsys):
    out = tmp_path / "results"
    rc = main(["bench", "--data", str(tmp_path / "data"), "--images", "48", "--classes", "3", "--batch-size", "8",
               "--image-size", "32", "--steps", "2", "--warmup", "1", "--plain-steps", "2", "--workers-budget", "2",
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    [result] = out.glob("bench-*.json")
    data = json.loads(result.read_text())
    cases = data["figures"]["cases"]
    assert {"ceiling", "plain", "hand_tuned", "boosted_cpu"} <= set(cases)
    assert all(c["samples_per_s"] > 0 for c in cases.values())
    assert {"boosted_cpu_vs_hand_tuned", "boosted_best_vs_plain"} <= set(data["bars"])
    assert result.with_suffix(".md").exists()
    printed = capsys.readouterr().out
    assert "No CUDA GPU: these figures are not meaningful" in printed  # this machine has none
    assert "| ceiling |" not in printed and " % |" not in printed and "| boosted_cpu |" in printed
