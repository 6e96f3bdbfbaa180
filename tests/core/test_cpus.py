from __future__ import annotations

from lightning_gpu_boost.core import cpus


def test_usable_cpus_is_positive():
    assert cpus.usable_cpus() >= 1


def test_cgroup_v2_and_v1_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert cpus._cgroup_cpu_limit(tmp_path) == 2.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpus._cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cpus._cgroup_cpu_limit(tmp_path) == 3.0


def test_default_num_workers_shares_cpus_among_processes(monkeypatch):
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 16)
    assert cpus.default_num_workers(procs_per_node=1) == 15
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert cpus.default_num_workers() == 3
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 1)
    assert cpus.default_num_workers() == 0
