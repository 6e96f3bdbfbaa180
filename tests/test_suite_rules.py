"""Rules the test suite keeps for itself, read from its source."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_trainer_names_its_accelerator_and_devices():
    """A Trainer left to ``devices="auto"`` on a machine with two GPUs runs DDP: Lightning starts a second rank by
    running pytest's own command line again, and the first waits for it inside the test (seen on 2 x H200). Each
    Trainer names both, runs on the CPU (one device there), or takes them from a dict (``trainer_kwargs`` and its
    kin name them)."""
    unnamed = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Trainer"):
                continue
            names = {k.arg: ast.unparse(k.value) for k in node.keywords}
            if None in names or {"accelerator", "devices"} <= names.keys() or names.get("accelerator") == "'cpu'":
                continue
            unnamed.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}")
    assert not unnamed, f"Trainer without accelerator= and devices=: {unnamed}"


def test_every_benchmark_trainer_names_its_devices():
    """A benchmark's one-GPU figure stays one GPU's on a host with several (``devices="auto"`` would run DDP)."""
    unnamed = []
    for path in sorted((TESTS.parent / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Trainer":
                names = {k.arg for k in node.keywords}
                if None not in names and "devices" not in names:
                    unnamed.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}")
    assert not unnamed, f"Trainer without devices=: {unnamed}"
