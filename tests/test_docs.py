"""Every Python code block in the README and docs/ runs, and every example script runs (small, on CPU), each as a
program of its own (``tests/warm_python.py``: forked from a process that has imported torch and Lightning)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.warm_python import run_python

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_code_blocks_run(page, tmp_path):
    code = "\n\n".join(python_blocks(page))
    status, output = run_python(code=code, cwd=tmp_path, env=_env())
    assert status == 0, output[-4000:]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_run(example, tmp_path):
    status, output = run_python(path=example, cwd=tmp_path, env=_env())
    assert status == 0, output[-4000:]


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}


def test_no_page_carries_a_commit_hash():
    """History and commit hashes live beside the results (``benchmarks/results/history/``), not in the pages."""
    commit = re.compile(r"(?<![0-9A-Za-z_#x])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
    found = [f"{page.name}:{n}: {m.group(0)}" for page in PAGES
             for n, line in enumerate(page.read_text().splitlines(), 1) for m in commit.finditer(line)]  # fmt: skip
    assert not found, found


#: the reading budget of README.md and docs/ (issue 65): words as ``wc -w`` counts them, code blocks included
WORD_BUDGET = 15_000
#: pages that are references, not features: the four-part shape does not apply
REFERENCE_PAGES = {"architecture.md", "getting-started.md", "index.md", "lmdb_format.md", "method.md"}


def test_the_docs_fit_the_reading_budget():
    words = sum(len(page.read_text().split()) for page in PAGES)
    assert words <= WORD_BUDGET, f"README.md and docs/ hold {words:,} words; the budget is {WORD_BUDGET:,}"


@pytest.mark.parametrize("page", [p for p in PAGES if p.parent.name == "docs" and p.name not in REFERENCE_PAGES],
                         ids=lambda p: p.name)
def test_every_feature_page_has_the_four_parts(page):
    headings = [line for line in page.read_text().splitlines() if line.startswith("## ")]
    for part in ("Turn it on", "What it logs", "Measured effect", "Caveats"):
        assert any(part in h for h in headings), f"{page.name} has no '{part}' section: {headings}"
