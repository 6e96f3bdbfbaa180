"""The integrity fuzz harness (benchmarks/integrity.py) on a sample of offsets covering every page kind."""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_sampled_byte_flips_never_read_back_wrong(tmp_path):
    """The script as a program of its own (``tests/warm_python.py``: forked from a process that has imported torch
    and Lightning)."""
    from tests.warm_python import run_python

    status, output = run_python(path=ROOT / "benchmarks" / "integrity.py", args=("--sample", "12", "--no-write"),
                                cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=240)  # fmt: skip
    assert status == 0, output[-3000:]
    result = json.loads(next(line for line in reversed(output.strip().splitlines()) if line.startswith("{")))
    assert {"meta", "branch", "leaf"} <= set(result["page_kinds"]), result
    assert result["totals"]["silent_wrong_reads"] == 0, result
    assert result["totals"]["verify_missed_flips_that_change_reads"] == 0, result
    bars = result["bars"]
    assert bars["dir_loop_records"]["pass"] and bars["dir_loop_wrong_labels"]["pass"], bars
