"""Our callbacks on the loaders users already stream with (issue 42): torchdata's ``StatefulDataLoader`` and
WebDataset's tar shards, each in a real Lightning Trainer with ``GPUBoost()``: every sample once per epoch, the
worker count left alone where another count could change which samples an epoch sees (and said), and an exact
mid-epoch resume through the library's own loader state. litdata's loader: ``tests/datamodules/test_streaming.py``."""

from __future__ import annotations

import logging

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from lightning_gpu_boost.callbacks import GPUBoost
from tests.helpers import ImageIdModel

N = 24


class Images(Dataset):
    """``N`` small uint8 images; a label names its sample."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.full((3, 8, 8), i, dtype=torch.uint8), i


def _boost() -> GPUBoost:
    return GPUBoost(workers_budget_s=5.0, normalize=((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))


def _once_per_epoch(model: ImageIdModel, epochs: int) -> None:
    seen = sum(model.seen["train"], [])
    assert len(seen) == epochs * N
    for e in range(epochs):
        assert sorted(seen[e * N : (e + 1) * N]) == list(range(N)), e


def test_torchdata_stateful_loader_every_sample_once_and_its_count_left_alone(trainer_kwargs, caplog):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    loader = stateful.StatefulDataLoader(Images(), batch_size=4, shuffle=True, num_workers=2)
    model = ImageIdModel()
    with caplog.at_level(logging.INFO):
        pl.Trainer(max_epochs=2, callbacks=[_boost()], **trainer_kwargs).fit(model, loader)
    _once_per_epoch(model, 2)
    assert loader.num_workers == 2
    assert "leaves the train loader at num_workers=2: StatefulDataLoader keeps its own resume state" in caplog.text
    assert {dtype for dtype, _, _ in model.images} == {"torch.float32"}  # normalized, as a GPU run's would be


def test_torchdata_stateful_loader_resumes_mid_epoch_exactly(tmp_path, trainer_kwargs):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader():
        torch.manual_seed(0)
        return stateful.StatefulDataLoader(Images(), batch_size=4, shuffle=True, num_workers=2)

    kwargs = {**trainer_kwargs, "enable_checkpointing": True}
    every = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1,
                                         filename="{step}")  # fmt: skip
    whole = ImageIdModel()
    pl.Trainer(max_epochs=2, callbacks=[every, _boost()], **kwargs).fit(whole, loader())
    _once_per_epoch(whole, 2)
    for step in (3, 6, 9):  # mid-epoch in the first epoch, its last batch, mid-epoch in the second
        resumed = ImageIdModel()
        pl.Trainer(max_epochs=2, callbacks=[_boost()], **kwargs).fit(
            resumed, loader(), ckpt_path=str(tmp_path / "ckpt" / f"step={step}.ckpt")
        )
        assert resumed.seen["train"] == whole.seen["train"][step:], step


@pytest.fixture
def shards(tmp_path):
    """``N`` samples in 4 WebDataset tar shards of 6, as ``webdataset.TarWriter`` writes them."""
    wds = pytest.importorskip("webdataset")
    urls = []
    for shard in range(4):
        path = tmp_path / f"shard-{shard:03d}.tar"
        with wds.TarWriter(str(path)) as sink:
            for i in range(shard * 6, shard * 6 + 6):
                sink.write({"__key__": f"{i:04d}", "pth": torch.full((3, 8, 8), i, dtype=torch.uint8), "cls": i})
        urls.append(str(path))
    return urls


def test_webdataset_every_sample_once_per_epoch_with_the_worker_count_tuned(shards, trainer_kwargs):
    import webdataset as wds
    from torch.utils.data import DataLoader

    dataset = wds.WebDataset(shards, shardshuffle=False, empty_check=False).decode().to_tuple("pth", "cls")
    loader = DataLoader(dataset, batch_size=3, num_workers=2)
    boost = _boost()
    model = ImageIdModel()
    pl.Trainer(max_epochs=2, callbacks=[boost], **trainer_kwargs).fit(model, loader)
    _once_per_epoch(model, 2)  # each worker reads its own shards, whatever the count: the tuner may change it
    assert "train" in boost.parts["auto_workers"].chosen


class Repeats(IterableDataset):
    """Every worker yields the whole stream (no split by get_worker_info()): the count decides the epoch's samples."""

    def __iter__(self):
        return iter([(torch.full((3, 8, 8), i, dtype=torch.uint8), i) for i in range(N)])


def test_an_iterable_dataset_that_does_not_split_keeps_its_count_and_is_told_why(trainer_kwargs, caplog):
    from torch.utils.data import DataLoader

    loader = DataLoader(Repeats(), batch_size=4, num_workers=2)
    model = ImageIdModel()
    with caplog.at_level(logging.INFO):
        pl.Trainer(max_epochs=1, callbacks=[_boost()], **trainer_kwargs).fit(model, loader)
    assert loader.num_workers == 2 and len(sum(model.seen["train"], [])) == 2 * N  # the user's stream, as it was
    assert "Repeats is an IterableDataset whose code decides what each worker yields" in caplog.text
