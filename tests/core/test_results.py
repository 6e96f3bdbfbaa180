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


def test_the_environment_names_the_packages_own_commit_and_sources(tmp_path, monkeypatch):
    """The commit is the package's checkout's, wherever the script runs (not the repository around the working
    folder); the sources' digest says which code ran where no commit can be read."""
    import subprocess

    from lightning_gpu_boost.core import results

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # another repository around the working folder
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    env = results.environment()
    root = results._package_root()
    if (root / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        assert env["git_commit"] == head
    assert len(env["package_source_sha"]) == 16 and env["package_source_sha"] == results.package_source_sha()
    assert env["lightning_gpu_boost"]
