"""Result files (``core/results.py``): bars, and a JSON with its environment beside a Markdown table."""

from __future__ import annotations

import json

from lightning_gpu_boost.core.results import bar, environment, write_result


def test_bars_pass_at_the_target_unless_strict():
    assert bar(0.9, 0.9, "x")["pass"] and not bar(0.9, 0.9, "x", strict=True)["pass"]
    assert bar(0.2, 0.25, "frac", higher_is_better=False) == {"value": 0.2, "target": 0.25, "unit": "frac",
                                                               "pass": True}  # fmt: skip


def test_a_result_holds_its_environment_figures_and_bars(tmp_path):
    path = write_result("demo", {"plain": {"samples_per_s": 10.123456}}, {"speedup": bar(2.0, 1.5, "x")}, tmp_path)
    data = json.loads(path.read_text())
    assert data["script"] == "demo" and data["bars"]["speedup"]["pass"] is True
    assert {"torch", "lightning", "cpu_count", "date"} <= set(data["environment"])
    table = path.with_suffix(".md").read_text()
    assert "| speedup | 2.0 | 1.5 | x | True |" in table and "| plain.samples_per_s | 10.123 |" in table
    assert environment()["cpu_count"] >= 1
