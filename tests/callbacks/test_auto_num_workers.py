from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader

import lightning_gpu_boost.core.workers_cache as workers_cache
from lightning_gpu_boost.callbacks import AutoNumWorkers
from tests.core.test_workers import CPUHeavy
from tests.helpers import IndexDataset, RecordingModel, run_ddp


class Heavy(CPUHeavy):
    def __getitem__(self, i):
        super().__getitem__(i)
        return IndexDataset(len(self))[i]


class WorkersSeen(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        self.train = trainer.train_dataloader.num_workers
        self.persistent = trainer.train_dataloader.persistent_workers


def _fit(trainer_kwargs, callback, loader, **extra):
    spy = WorkersSeen()
    model = RecordingModel()
    pl.Trainer(callbacks=[callback, spy], max_epochs=1, limit_train_batches=4, **trainer_kwargs, **extra).fit(
        model, loader
    )
    return spy, model


def test_applies_a_measured_count_before_workers_start(trainer_kwargs, tmp_path):
    cb = AutoNumWorkers(workers_budget_s=10, max_workers=2, cache_path=str(tmp_path / "cache.json"))
    spy, model = _fit(trainer_kwargs, cb, DataLoader(Heavy(), batch_size=8))
    assert spy.train == cb.chosen["train"] > 0 and spy.persistent
    assert sorted(sum(model.seen["train"], [])) == list(range(32))  # same batches, now from workers
    assert cb.state_dict()["chosen"] == {"train": spy.train}


def test_cache_hit_skips_the_probe(trainer_kwargs, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache.json")
    _fit(
        trainer_kwargs,
        AutoNumWorkers(workers_budget_s=10, max_workers=2, cache_path=cache),
        DataLoader(Heavy(), batch_size=8),
    )

    def no_probe(*args, **kwargs):
        raise AssertionError("probed although the cache had the answer")

    monkeypatch.setattr(workers_cache, "tune_num_workers", no_probe)
    cb = AutoNumWorkers(cache_path=cache, max_workers=2)
    spy, _ = _fit(trainer_kwargs, cb, DataLoader(Heavy(), batch_size=8))
    assert cb.probes["train"].cached and spy.train == cb.chosen["train"]


def test_state_restores_without_probing(trainer_kwargs, monkeypatch):
    monkeypatch.setattr(workers_cache, "tune_num_workers", lambda *a, **k: pytest.fail("probed"))
    cb = AutoNumWorkers(use_cache=False)
    cb.load_state_dict({"chosen": {"train": 1}, "probes": {}})
    spy, _ = _fit(trainer_kwargs, cb, DataLoader(IndexDataset(32), batch_size=8))
    assert spy.train == 1


def test_keeps_an_explicit_user_value(trainer_kwargs, monkeypatch):
    monkeypatch.setattr(workers_cache, "tune_num_workers", lambda *a, **k: pytest.fail("probed"))
    spy, _ = _fit(
        trainer_kwargs,
        AutoNumWorkers(keep_user_value=True),
        DataLoader(IndexDataset(32), batch_size=8, num_workers=1),
    )
    assert spy.train == 1


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"workers_budget_s": -1.0}, "workers_budget_s must be a number > 0, got -1.0"),
        ({"tolerance": 1.0}, r"tolerance must be a number in \[0, 1\), got 1.0"),
        ({"max_workers": -1}, "max_workers must be an int >= 0 or None, got -1"),
        ({"prefetch_factor": 0}, "prefetch_factor must be an int >= 1, got 0"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AutoNumWorkers(**kwargs)


def test_ddp_ranks_agree_and_still_shard(tmp_path):
    results = run_ddp(
        f"""
        import lightning.pytorch as pl
        from torch.utils.data import DataLoader
        from lightning_gpu_boost.callbacks import AutoNumWorkers
        from tests.callbacks.test_auto_num_workers import Heavy, WorkersSeen
        spy = WorkersSeen()
        model = RecordingModel()
        trainer = pl.Trainer(accelerator="cpu", devices=NPROCS, strategy="ddp", max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[AutoNumWorkers(workers_budget_s=8, max_workers=2,
                                                       cache_path={str(tmp_path / "cache.json")!r}), spy])
        trainer.fit(model, DataLoader(Heavy(), batch_size=16, shuffle=True))
        (OUT / f"rank{{trainer.global_rank}}.json").write_text(json.dumps(
            {{"workers": spy.train, "ids": sum(model.seen["train"], [])}}))
        """,
        tmp_path,
    )
    assert results[0]["workers"] == results[1]["workers"]
    assert set(results[0]["ids"]).isdisjoint(results[1]["ids"])
    assert set(results[0]["ids"]) | set(results[1]["ids"]) == set(range(512))


def test_the_tuner_states_its_choice_and_decides_again_by_its_own_measurement(tmp_path, trainer_kwargs):
    """AutoNumWorkers records num_workers in the run record; asked again, it applies a count its probe measured as
    good and keeps its own otherwise, saying why."""
    from lightning_gpu_boost.core.run_record import run_record

    tuner = AutoNumWorkers(workers_budget_s=5, cache_path=str(tmp_path / "cache.json"))
    trainer = pl.Trainer(max_steps=4, callbacks=[tuner], **trainer_kwargs)
    trainer.fit(RecordingModel(), DataLoader(Heavy(), batch_size=4))
    record = run_record(trainer)
    choice = record.chosen("num_workers")
    assert choice is not None and choice.by == "AutoNumWorkers" and choice.value == tuner.chosen["train"]
    probe, chosen = tuner.probes["train"], tuner.chosen["train"]
    fewer = max((w for w in probe.table if w < chosen), default=None)
    if fewer is None:
        pytest.skip("the probe chose its smallest count")
    said = record.decide_again("num_workers", fewer, "the GPU idles inside the step")
    good, _ = probe.as_good(fewer, chosen, tuner.tolerance)
    assert ("decided again" in said) is good and ("keeps" in said) is (not good)
    assert trainer.train_dataloader.num_workers == (fewer if good else chosen)


class _WorkerCount(torch.utils.data.Dataset):
    """Sample ``i`` is ``(i, the loader's worker count)``: batches say which samples and how many workers made them."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        info = torch.utils.data.get_worker_info()
        return i, 0 if info is None else info.num_workers


class _Seen(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.batches: list[tuple[int, list[int], set[int]]] = []

    def training_step(self, batch, batch_idx):
        ids, counts = batch
        self.batches.append((self.current_epoch, ids.tolist(), set(counts.tolist())))
        return self.w * 0.0 + self.w.sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_count_decided_again_restarts_spanning_workers_at_the_epochs_end_and_skips_nothing(trainer_kwargs):
    """Asked again mid-epoch (the workers crowd the training process), AutoNumWorkers applies one worker fewer to a
    loader whose workers span epochs: the epoch ends with the old workers, the next starts the new count, and every
    epoch still holds every sample once."""
    from lightning_gpu_boost.callbacks import SpanEpochs
    from lightning_gpu_boost.core.run_record import run_record
    from lightning_gpu_boost.core.workers import WorkerProbe

    tuner = AutoNumWorkers(keep_user_value=True)

    class AskAgain(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.current_epoch == 0 and batch_idx == 1:
                loader = trainer.train_dataloader.source
                tuner.probes["train"] = WorkerProbe(num_workers=2, table={2: 100.0})
                run_record(trainer).choose("num_workers", 2, by="AutoNumWorkers", why="measured",
                                           decide_again=lambda p, r, **e: tuner._decide_again(trainer, loader, p, r, **e))  # fmt: skip
                self.said = run_record(trainer).decide_again("num_workers", 1, "no CPU left", training_batches_s=10.0)

    ask = AskAgain()
    loader = DataLoader(_WorkerCount(), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)
    model = _Seen()
    pl.Trainer(max_epochs=3, callbacks=[tuner, SpanEpochs(min_restart_share=0.0), ask], **trainer_kwargs).fit(model, loader)
    assert "num_workers 2 -> 1 from the next epoch" in ask.said
    for epoch in range(3):
        ids = sorted(i for e, batch, _ in model.batches if e == epoch for i in batch)
        assert ids == list(range(16)), epoch
    counts = {e: set().union(*(c for x, _, c in model.batches if x == e)) for e in range(3)}
    assert counts[0] == {2} and counts[1] == {1} and counts[2] == {1}, counts


def test_doctor_runs_the_advised_count_as_auto_num_workers_applies_it():
    """``doctor``'s trial fit at the count it advises runs the loader with AutoNumWorkers' defaults (the constants
    in ``core.loaders``): its predicted gain is the gain of what ``AutoNumWorkers()`` then does."""
    import inspect

    from lightning_gpu_boost.core.loaders import AUTO_PERSISTENT_WORKERS, AUTO_PREFETCH_FACTOR

    defaults = inspect.signature(AutoNumWorkers).parameters
    assert defaults["prefetch_factor"].default == AUTO_PREFETCH_FACTOR
    assert defaults["persistent_workers"].default == AUTO_PERSISTENT_WORKERS
