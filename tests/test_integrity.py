"""The integrity fuzz harness (benchmarks/integrity.py) on a sample of offsets covering every page kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sampled_byte_flips_never_read_back_wrong(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "integrity.py"), "--sample", "12", "--no-write"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"meta", "branch", "leaf"} <= set(result["page_kinds"]), result
    assert result["totals"]["silent_wrong_reads"] == 0, result
    assert result["totals"]["verify_missed_flips_that_change_reads"] == 0, result
    bars = result["bars"]
    assert bars["dir_loop_records"]["pass"] and bars["dir_loop_wrong_labels"]["pass"], bars
