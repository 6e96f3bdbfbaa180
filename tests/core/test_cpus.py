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


def test_a_trainer_says_how_many_processes_share_the_node(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # a launcher's value, used where no Trainer is given
    assert cpus.processes_per_node() == 4
    # Lightning's launcher of Trainer(devices=2) sets no LOCAL_WORLD_SIZE: the Trainer's devices decide
    assert cpus.processes_per_node(SimpleNamespace(world_size=4, num_devices=2)) == 2
    assert cpus.processes_per_node(SimpleNamespace(world_size=1, num_devices=1)) == 1
