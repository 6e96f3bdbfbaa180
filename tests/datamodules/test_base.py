from __future__ import annotations

import textwrap

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import TensorDataset

from lightning_gpu_boost.datamodules import BoostDataModule
from tests.helpers import IndexDataset, RecordingModel


class Indexed(BoostDataModule):
    def train_dataset(self):
        return IndexDataset(20)

    def val_dataset(self):
        return IndexDataset(8)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1, got 0"),
        ({"batch_size": 2.5}, "batch_size must be an int >= 1, got 2.5"),
        ({"num_workers": -1}, "num_workers must be an int >= 0, None or 'auto', got -1"),
        ({"num_workers": "many"}, "got 'many'"),
        ({"prefetch_factor": 0}, "prefetch_factor must be an int >= 1, got 0"),
        ({"pin_memory": "yes"}, "pin_memory must be True or False or None, got 'yes'"),
        ({"collate_fn": 3}, "collate_fn must be a callable or None, got 3"),
        ({"normalize": (1, 2, 3)}, "normalize must be"),
    ],
)
def test_arguments_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Indexed(**kwargs)


def test_loader_defaults():
    dm = Indexed(batch_size=4, num_workers=2, drop_last=True)
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert train.num_workers == 2 and train.persistent_workers and train.prefetch_factor == 4
    assert train.drop_last and not val.drop_last
    assert (
        type(train.sampler).__name__ == "BlockShuffleSampler" and train.sampler.block_size == 1 and type(val.sampler).__name__ == "SequentialSampler"
    )
    assert not train.pin_memory  # no Trainer on CUDA
    assert dm.test_dataloader() == [] and dm.predict_dataloader() == []
    zero = Indexed(num_workers=0).train_dataloader()
    assert zero.num_workers == 0 and not zero.persistent_workers


def test_default_worker_count_comes_from_usable_cpus(monkeypatch):
    from lightning_gpu_boost.datamodules import base

    monkeypatch.setattr(base, "default_num_workers", lambda procs=None: 5)
    assert Indexed().train_dataloader().num_workers == 5


def test_default_worker_count_shares_the_node_among_its_ddp_ranks(monkeypatch):
    # Lightning's launcher of Trainer(devices=2) sets no LOCAL_WORLD_SIZE: the count comes from the Trainer (on
    # 2 x H200 with 32 CPUs, each rank took 31 workers and two GPUs trained no faster than one)
    from types import SimpleNamespace

    from lightning_gpu_boost.core import cpus

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 32)
    dm = Indexed()
    assert dm.train_dataloader().num_workers == 31
    strategy = SimpleNamespace(root_device=SimpleNamespace(type="cpu"))
    dm.trainer = SimpleNamespace(world_size=4, num_devices=2, strategy=strategy)  # two nodes of two GPUs
    assert dm.train_dataloader().num_workers == 15


def test_auto_num_workers_measures_each_stage():
    dm = Indexed(num_workers="auto", batch_size=4, workers_budget_s=5)
    assert dm.train_dataloader().num_workers == 0  # in-memory samples: workers only add overhead
    assert set(dm.auto_probes) == {"train"} and 0 in dm.auto_probes["train"].table
    with pytest.raises(ValueError, match="workers_budget_s must be a number > 0"):
        Indexed(workers_budget_s=0)


def test_missing_train_dataset_is_a_clear_error():
    with pytest.raises(NotImplementedError, match="must implement train_dataset"):
        BoostDataModule().train_dataloader()


def test_trains_in_a_trainer_with_validation(trainer_kwargs):
    model = RecordingModel()
    trainer = pl.Trainer(max_epochs=1, **trainer_kwargs)
    trainer.fit(model, datamodule=Indexed(batch_size=4, num_workers=0, shuffle=False))
    assert model.seen["train"][0] == [0, 1, 2, 3] and len(model.seen["train"]) == 5
    assert len(model.seen["val"]) == 4  # sanity check (2) + epoch end (2)


def test_collate_fn_is_used():
    def collate(samples):
        return torch.stack([s[0] for s in samples])

    class Tensors(BoostDataModule):
        def train_dataset(self):
            return TensorDataset(torch.arange(6.0))

    batch = next(
        iter(Tensors(batch_size=3, num_workers=0, shuffle=False, collate_fn=collate).train_dataloader())
    )
    assert batch.tolist() == [0.0, 1.0, 2.0]


class Indexed24(BoostDataModule):
    def train_dataset(self):
        return IndexDataset(24)


def test_a_run_resumed_mid_epoch_neither_repeats_nor_skips_a_batch(tmp_path, trainer_kwargs):
    """Lightning restarts the epoch for plain loaders; the DataModules' shuffled training loader saves where the
    epoch stands, so the resumed run sees exactly the batches the uninterrupted one would have seen next."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    kwargs = {**trainer_kwargs, "enable_checkpointing": True, "default_root_dir": str(tmp_path)}
    first = RecordingModel()
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1, save_last=False)
    pl.Trainer(callbacks=[ckpt], max_steps=2, **kwargs).fit(first, datamodule=Indexed24(batch_size=4, num_workers=2))
    resumed = RecordingModel()
    pl.Trainer(max_epochs=1, **trainer_kwargs).fit(resumed, datamodule=Indexed24(batch_size=4, num_workers=2),
                                                   ckpt_path=sorted(tmp_path.glob("*step=2.ckpt"))[0])  # fmt: skip
    whole = RecordingModel()
    pl.Trainer(max_epochs=1, **trainer_kwargs).fit(whole, datamodule=Indexed24(batch_size=4, num_workers=2))
    assert first.seen["train"] + resumed.seen["train"] == whole.seen["train"]
    assert sorted(i for b in whole.seen["train"] for i in b) == list(range(24))


def test_ddp_resume_mid_epoch_keeps_every_rank_exactly_once(tmp_path):
    from tests.helpers import run_ddp

    script = """
        import lightning.pytorch as pl
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning_gpu_boost.datamodules import BoostDataModule

        class Indexed(BoostDataModule):
            def train_dataset(self):
                return IndexDataset(48)

        common = dict(accelerator="cpu", devices=NPROCS, strategy="ddp", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(OUT))
        model = RecordingModel()
        if MODE == "first":
            ckpt = ModelCheckpoint(dirpath=str(CKPT), every_n_train_steps=2, save_top_k=-1, save_last=False)
            pl.Trainer(max_steps=2, callbacks=[ckpt], **common).fit(model, datamodule=Indexed(batch_size=4, num_workers=0))
        elif MODE == "resume":
            path = sorted(CKPT.glob("*step=2.ckpt"))[0]
            pl.Trainer(max_epochs=1, enable_checkpointing=False, **common).fit(
                model, datamodule=Indexed(batch_size=4, num_workers=0), ckpt_path=str(path))
        else:
            pl.Trainer(max_epochs=1, enable_checkpointing=False, **common).fit(
                model, datamodule=Indexed(batch_size=4, num_workers=0))
        (OUT / f"rank{model.global_rank}.json").write_text(json.dumps(model.seen["train"]))
        """
    ckpt = tmp_path / "ckpt"
    runs = {}
    for mode in ("first", "resume", "whole"):
        code = f"from pathlib import Path\nMODE = {mode!r}\nCKPT = Path({str(ckpt)!r})\n" + textwrap.dedent(script)
        (tmp_path / mode).mkdir()
        runs[mode] = run_ddp(code, tmp_path / mode)
    for rank in (0, 1):
        assert runs["first"][rank] + runs["resume"][rank] == runs["whole"][rank], rank
    seen = [i for rank in (0, 1) for batch in runs["whole"][rank] for i in batch]
    assert sorted(seen) == list(range(48))
