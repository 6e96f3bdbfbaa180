"""What the cores get from the Lightning job (``_job.py``): Lightning's worker seeding where workers are seeded,
and no broadcast for a job of one process."""

from __future__ import annotations

from types import SimpleNamespace


def test_worker_seed_follows_seed_everything(monkeypatch):
    from lightning_gpu_boost._job import lightning_worker_seed

    monkeypatch.delenv("PL_SEED_WORKERS", raising=False)
    assert lightning_worker_seed(0) is None
    monkeypatch.setenv("PL_SEED_WORKERS", "1")
    seed = lightning_worker_seed(3)
    assert seed is not None and seed.keywords == {"rank": 3}


def test_a_job_of_one_process_has_no_broadcast():
    from lightning_gpu_boost._job import job_broadcast

    assert job_broadcast(None) is None and job_broadcast(SimpleNamespace(world_size=1)) is None
    sent = []
    trainer = SimpleNamespace(world_size=2, strategy=SimpleNamespace(broadcast=lambda obj, src: sent.append(src) or obj))
    assert job_broadcast(trainer)({"a": 1}, 0) == {"a": 1} and sent == [0]
