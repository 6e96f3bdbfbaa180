"""Rules the test suite keeps for itself, read from its source."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _trainers(folder: Path) -> Iterator[tuple[str, dict[str | None, str]]]:
    """``(path:line, {keyword: source})`` of every ``Trainer(...)`` call under ``folder`` (``None``: a ``**``)."""
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Trainer":
                where = f"{path.relative_to(TESTS.parent)}:{node.lineno}"
                yield where, {k.arg: ast.unparse(k.value) for k in node.keywords}


def test_every_trainer_names_its_accelerator_and_devices():
    """A Trainer left to ``devices="auto"`` on a machine with two GPUs runs DDP: Lightning starts a second rank by
    running pytest's own command line again, and the first waits for it inside the test (seen on 2 x H200). Each
    Trainer names both, runs on the CPU (one device there), or takes them from a dict (``trainer_kwargs`` and its
    kin name them)."""
    unnamed = [where for where, names in _trainers(TESTS)
               if not (None in names or {"accelerator", "devices"} <= names.keys()
                       or names.get("accelerator") == "'cpu'")]  # fmt: skip
    assert not unnamed, f"Trainer without accelerator= and devices=: {unnamed}"


def test_every_benchmark_trainer_names_its_devices():
    """A benchmark's one-GPU figure stays one GPU's on a host with several (``devices="auto"`` would run DDP)."""
    unnamed = [where for where, names in _trainers(TESTS.parent / "benchmarks")
               if None not in names and "devices" not in names]  # fmt: skip
    assert not unnamed, f"Trainer without devices=: {unnamed}"
