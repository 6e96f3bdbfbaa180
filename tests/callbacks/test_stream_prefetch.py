from __future__ import annotations

import logging

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from lightning_gpu_boost.callbacks import StreamPrefetch
from lightning_gpu_boost.core.prefetch import StreamPrefetcher
from tests.helpers import IndexDataset, RecordingModel, StatefulLoader, run_ddp


def _loaders(n=24, bs=4, shuffle=True):
    return DataLoader(IndexDataset(n), batch_size=bs, shuffle=shuffle), DataLoader(
        IndexDataset(n), batch_size=bs
    )


def _run_all_stages(trainer_kwargs, callbacks, **extra):
    pl.seed_everything(7)
    model = RecordingModel()
    trainer = pl.Trainer(callbacks=callbacks, max_epochs=2, **trainer_kwargs, **extra)
    train, val = _loaders()
    trainer.fit(model, train, val)
    trainer.validate(model, val, verbose=False)
    trainer.test(model, val, verbose=False)
    trainer.predict(model, val)
    return model.seen


@pytest.mark.parametrize(
    "extra",
    [{}, {"limit_train_batches": 3, "limit_val_batches": 2}, {"accumulate_grad_batches": 2}],
    ids=["full", "limits", "accumulate"],
)
def test_same_batches_same_order_in_every_stage(trainer_kwargs, extra):
    plain = _run_all_stages(trainer_kwargs, [], **extra)
    wrapped = _run_all_stages(trainer_kwargs, [StreamPrefetch(cpu_lookahead=True, depth=2)], **extra)
    assert wrapped == plain
    assert all(plain[stage] for stage in ("train", "val", "test", "predict"))


def test_dataloader_iter_steps(trainer_kwargs):
    class IterModel(RecordingModel):
        def training_step(self, dataloader_iter):
            batch, _, _ = next(dataloader_iter)
            return self._record("train", batch)

    def run(callbacks):
        pl.seed_everything(3)
        model = IterModel()
        pl.Trainer(callbacks=callbacks, max_epochs=1, limit_val_batches=0, **trainer_kwargs).fit(
            model, _loaders()[0]
        )
        return model.seen["train"]

    assert run([StreamPrefetch(cpu_lookahead=True)]) == run([])


def test_installs_on_the_strategy_and_removes_in_teardown(trainer_kwargs):
    wrapped_types = []

    class Spy(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            wrapped_types.append(type(trainer.train_dataloader).__name__)
            wrapped_types.append(type(trainer.fit_loop._combined_loader.flattened[0]).__name__)

    cb = StreamPrefetch(cpu_lookahead=True)
    trainer = pl.Trainer(callbacks=[cb, Spy()], max_epochs=1, **trainer_kwargs)
    trainer.fit(RecordingModel(), *_loaders())
    assert wrapped_types[1] == StreamPrefetcher.__name__
    assert "process_dataloader" not in vars(trainer.strategy) and not cb.active


def test_noop_without_cuda(trainer_kwargs, caplog):
    cb = StreamPrefetch()
    with caplog.at_level(logging.INFO):
        pl.Trainer(callbacks=[cb], max_epochs=1, **trainer_kwargs).fit(RecordingModel(), _loaders()[0])
    assert not cb.active
    assert "no CUDA device in use" in caplog.text


def test_user_transfer_hook_keeps_its_semantics(trainer_kwargs):
    class HookModel(RecordingModel):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            assert batch[0].device.type == "cpu"
            return batch

    cb = StreamPrefetch(cpu_lookahead=True)
    with pytest.warns(UserWarning, match="on_before_batch_transfer is overridden"):
        pl.Trainer(callbacks=[cb], max_epochs=1, **trainer_kwargs).fit(HookModel(), _loaders()[0])
    assert not cb.active


def test_loader_error_propagates(trainer_kwargs):
    class Broken(IndexDataset):
        def __getitem__(self, i):
            if i == 9:
                raise RuntimeError("corrupt sample 9")
            return super().__getitem__(i)

    trainer = pl.Trainer(callbacks=[StreamPrefetch(cpu_lookahead=True)], max_epochs=1, **trainer_kwargs)
    with pytest.raises(RuntimeError, match="corrupt sample 9"):
        trainer.fit(RecordingModel(), DataLoader(Broken(16), batch_size=4))


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"depth must be an int in \[1, 16\], got 0"):
        StreamPrefetch(depth=0)
    with pytest.raises(ValueError, match=r"depth must be an int in \[1, 16\], got 1000000000"):
        StreamPrefetch(depth=10**9)
    with pytest.raises(ValueError, match="dtype must be"):
        StreamPrefetch(normalize_dtype="float64")
    with pytest.raises(ValueError, match="normalize must be"):
        StreamPrefetch(normalize=(1, 2, 3))


def _resume_batches(tmp_path, trainer_kwargs, callbacks_factory):
    """Train to a checkpoint at step 3 of a 6-batch epoch, resume to the end; return the resumed batches."""
    kwargs = {**trainer_kwargs, "enable_checkpointing": True, "default_root_dir": str(tmp_path)}
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1, save_last=False)
    loader = StatefulLoader(IndexDataset(24), batch_size=4)
    first = RecordingModel()
    pl.Trainer(callbacks=[ckpt, *callbacks_factory()], max_steps=3, **kwargs).fit(first, loader)
    path = sorted(tmp_path.glob("*step=3.ckpt"))[0]
    resumed = RecordingModel()
    loader = StatefulLoader(IndexDataset(24), batch_size=4)
    pl.Trainer(callbacks=callbacks_factory(), max_epochs=1, **kwargs).fit(resumed, loader, ckpt_path=path)
    return first.seen["train"], resumed.seen["train"]


def test_mid_epoch_resume_neither_loses_nor_repeats(tmp_path, trainer_kwargs):
    plain_first, plain_rest = _resume_batches(tmp_path / "plain", trainer_kwargs, lambda: [])
    first, rest = _resume_batches(
        tmp_path / "wrapped", trainer_kwargs, lambda: [StreamPrefetch(cpu_lookahead=True, depth=2)]
    )
    assert first == plain_first == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert rest == plain_rest == [[12, 13, 14, 15], [16, 17, 18, 19], [20, 21, 22, 23]]


def test_ddp_shards_are_disjoint_complete_and_reshuffled(tmp_path):
    results = run_ddp(
        """
        import lightning.pytorch as pl
        from torch.utils.data import DataLoader
        from lightning_gpu_boost.callbacks import StreamPrefetch
        pl.seed_everything(1)
        model = RecordingModel()
        trainer = pl.Trainer(accelerator="cpu", devices=NPROCS, strategy="ddp", max_epochs=2, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[StreamPrefetch(cpu_lookahead=True)])
        trainer.fit(model, DataLoader(IndexDataset(32), batch_size=4, shuffle=True))
        epochs = [sum(model.seen["train"][:4], []), sum(model.seen["train"][4:], [])]
        (OUT / f"rank{trainer.global_rank}.json").write_text(json.dumps(epochs))
        """,
        tmp_path,
    )
    for epoch in (0, 1):
        shards = [set(r[epoch]) for r in results]
        assert shards[0].isdisjoint(shards[1])
        assert shards[0] | shards[1] == set(range(32))
    assert results[0][0] != results[0][1]  # the sampler's epoch was set: a new order each epoch


class _FirstBatch(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)
        self.batches = []

    def training_step(self, batch, batch_idx):
        self.batches.append([t.cpu() for t in batch])
        return self.layer(batch[0].float().mean((2, 3))).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_move_normalize_same_images_uint8_workers_transform_restored(trainer_kwargs, caplog):
    from lightning_gpu_boost.core.move_normalize import Uint8Transform
    from tests.core.test_move_normalize import _imagenet_tf
    from tests.helpers import FakeImageFolder

    def fit(callbacks):
        ds = FakeImageFolder(n=8, transform=_imagenet_tf())
        model = _FirstBatch()
        pl.Trainer(callbacks=callbacks, max_epochs=1, **trainer_kwargs).fit(
            model, DataLoader(torch.utils.data.Subset(ds, range(8)), batch_size=4)
        )
        assert not isinstance(ds.transform, Uint8Transform)  # restored in teardown
        return model.batches, set(ds.produced)

    plain, plain_seen = fit([])
    with caplog.at_level(logging.INFO):
        moved, moved_seen = fit([StreamPrefetch(move_normalize=True, cpu_lookahead=True)])
    assert "now run on the GPU" in caplog.text
    assert plain_seen == {torch.float32} and moved_seen == {torch.uint8}
    assert len(moved) == len(plain) == 2
    for (xm, ym), (xp, yp) in zip(moved, plain, strict=True):
        assert xm.dtype == torch.float32
        torch.testing.assert_close(xm, xp, atol=1e-6, rtol=0)
        assert torch.equal(ym, yp)


# ---------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_trainer_receives_prefetched_normalized_batches(tmp_path):
    class Check(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 2)
            self.dtypes = set()

        def training_step(self, batch, batch_idx):
            x, y = batch
            assert x.is_cuda and y.is_cuda
            self.dtypes.add(x.dtype)
            return self.layer(x.float().mean((2, 3))).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(
        torch.randint(0, 256, (64, 3, 16, 16), dtype=torch.uint8), torch.randint(0, 2, (64,))
    )
    cb = StreamPrefetch(normalize=((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)), normalize_dtype="bfloat16", channels_last=True)
    model = Check()
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=2, callbacks=[cb], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(model, DataLoader(data, batch_size=8, pin_memory=True))
    assert model.dtypes == {torch.bfloat16}


@pytest.mark.gpu
def test_gpu_a_loader_without_workers_that_yields_gpu_tensors_is_prefetched_as_it_is(tmp_path):
    """Indices drawn on the GPU (a table held there): the loader is not switched to pin_memory=True, whose pinning
    refuses CUDA tensors; a transform gathers the rows on the side stream."""
    rows = torch.arange(40.0, device="cuda").reshape(20, 2)

    class Sum(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.seen = []

        def training_step(self, batch, batch_idx):
            self.seen.append(batch[:, 0].div(2).long().tolist())
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Indices(torch.utils.data.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, index):
            return index

    batches = torch.randperm(20, device="cuda").split(5)
    loader = DataLoader(Indices(), sampler=list(batches), batch_size=None)
    model = Sum()
    cb = StreamPrefetch(transform=lambda index: rows[index])
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, callbacks=[cb], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(model, loader)
    assert not loader.pin_memory
    assert model.seen == [b.tolist() for b in batches]


@pytest.mark.gpu
def test_gpu_move_normalize_with_real_torchvision(tmp_path):
    datasets = pytest.importorskip("torchvision.datasets")
    from torchvision import transforms

    from lightning_gpu_boost.callbacks import GPUBoost
    from lightning_gpu_boost.core.images import make_jpeg_folder

    root = make_jpeg_folder(tmp_path / "jpeg", n=16, num_classes=2)
    tf = transforms.Compose([transforms.CenterCrop(64), transforms.ToTensor(),
                             transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])  # fmt: skip
    ds = datasets.ImageFolder(str(root), tf)
    expected = torch.stack([ds[i][0] for i in range(4)])
    model = _FirstBatch()
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, default_root_dir=tmp_path,
                         callbacks=[GPUBoost(auto_workers=False, watchdog=False, channels_last=False)])  # fmt: skip
    trainer.fit(model, DataLoader(ds, batch_size=4))
    x = model.batches[0][0]
    assert x.dtype == torch.float32
    torch.testing.assert_close(x, expected, atol=1e-5, rtol=0)
    assert ds.transform is tf


class Jitter:
    """A per-sample random shift of the features: the stand-in for a GPU augmentation (a class, as LightningCLI
    builds one from YAML with class_path)."""

    def __call__(self, batch):
        x, *rest = batch
        return [x + torch.rand(x.shape[0], 1, device=x.device), *rest]


class SeesFeatures(RecordingModel):
    def __init__(self) -> None:
        super().__init__()
        self.features: dict[str, list[torch.Tensor]] = {"train": [], "val": []}

    def training_step(self, batch, batch_idx):
        self.features["train"].append(batch[0].clone())
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.features["val"].append(batch[0].clone())
        return super().validation_step(batch, batch_idx)


def test_a_batch_transform_reaches_training_only_and_draws_anew_each_epoch(trainer_kwargs):
    def fit() -> SeesFeatures:
        model = SeesFeatures()
        callback = StreamPrefetch(cpu_lookahead=True, depth=2, transform=Jitter(), transform_seed=3)
        trainer = pl.Trainer(callbacks=[callback], max_epochs=2, **trainer_kwargs)
        train = DataLoader(IndexDataset(16), batch_size=4)
        trainer.fit(model, train, DataLoader(IndexDataset(8), batch_size=4))
        return model

    model, again = fit(), fit()
    plain = [b[0] for b in DataLoader(IndexDataset(16), batch_size=4)]
    train = model.features["train"]
    assert len(train) == 8 and all(not torch.equal(t, p) for t, p in zip(train, plain * 2, strict=True))
    assert not torch.equal(train[0] - plain[0], train[4] - plain[0]), "epoch 1 drew the same numbers as epoch 0"
    assert all(torch.equal(a, b) for a, b in zip(train, again.features["train"], strict=True)), "not reproducible"
    val_plain = [b[0] for b in DataLoader(IndexDataset(8), batch_size=4)]
    assert all(torch.equal(v, p) for v, p in zip(model.features["val"][-2:], val_plain, strict=True))


def test_a_batch_transform_runs_on_a_cpu_only_trainer_too(trainer_kwargs):
    """Without CUDA (and without cpu_lookahead) the prefetcher is off, but a user's transform is not skipped."""
    model = SeesFeatures()
    trainer = pl.Trainer(callbacks=[StreamPrefetch(transform=Jitter(), transform_seed=3)], max_epochs=1,
                         **trainer_kwargs)  # fmt: skip
    trainer.fit(model, DataLoader(IndexDataset(16), batch_size=4))
    plain = [b[0] for b in DataLoader(IndexDataset(16), batch_size=4)]
    assert len(model.features["train"]) == 4
    assert all(not torch.equal(t, p) for t, p in zip(model.features["train"], plain, strict=True))


def test_a_run_resumed_mid_epoch_draws_what_the_uninterrupted_run_drew(tmp_path, trainer_kwargs):
    """The DataModules' loader resumes at the epoch's next batch; the transform's draws resume with it."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.datamodules.test_base import Indexed24

    def prefetch() -> StreamPrefetch:
        return StreamPrefetch(cpu_lookahead=True, transform=Jitter(), transform_seed=3)

    kwargs = {**trainer_kwargs, "enable_checkpointing": True, "default_root_dir": str(tmp_path)}
    first = SeesFeatures()
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1, save_last=False)
    pl.Trainer(callbacks=[ckpt, prefetch()], max_steps=3, **kwargs).fit(first, datamodule=Indexed24(batch_size=4))
    resumed = SeesFeatures()
    pl.Trainer(callbacks=[prefetch()], max_epochs=2, **trainer_kwargs).fit(
        resumed, datamodule=Indexed24(batch_size=4), ckpt_path=sorted(tmp_path.glob("*step=3.ckpt"))[0])
    whole = SeesFeatures()
    pl.Trainer(callbacks=[prefetch()], max_epochs=2, **trainer_kwargs).fit(whole, datamodule=Indexed24(batch_size=4))
    both = first.features["train"] + resumed.features["train"]
    assert len(both) == len(whole.features["train"]) == 12
    assert all(torch.equal(a, b) for a, b in zip(both, whole.features["train"], strict=True))


class SeesAudioFeatures(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(80, 1)
        self.shapes: list[tuple] = []

    def training_step(self, batch, batch_idx):
        features, frames, labels = batch
        self.shapes.append((tuple(features.shape), frames.tolist(), labels.tolist()))
        return self.layer(features).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_batch_transform_runs_on_the_batches_of_a_dali_loader(trainer_kwargs, tmp_path):
    """A loader whose batches are already on the device (DALILoader) is wrapped only to run the transform: audio
    clips decoded by DALI, log-mel features from StreamPrefetch(transform=LogMel(...)) in a Trainer."""
    pytest.importorskip("nvidia.dali", reason="needs the `dali` extra")
    import functools
    import wave

    import numpy as np

    from lightning_gpu_boost.core.dali import DALILoader, FileListSource, audio_graph
    from lightning_gpu_boost.core.gpu_transforms import LogMel

    paths = []
    for k in range(8):
        paths.append(tmp_path / f"clip_{k}.wav")
        with wave.open(str(paths[-1]), "wb") as f:
            f.setnchannels(1), f.setsampwidth(2), f.setframerate(16_000)
            f.writeframes((np.sin(np.arange(1600 + 160 * k) * 0.1) * 3000).astype("<i2").tobytes())
    loader = DALILoader(FileListSource(paths, list(range(8))), functools.partial(audio_graph, gpu=False), 4,
                        num_threads=1, read_threads=1)  # fmt: skip
    model = SeesAudioFeatures()
    prefetch = StreamPrefetch(cpu_lookahead=True, transform=LogMel(source_rate=16_000, rate=16_000, pad_to=16))
    trainer = pl.Trainer(callbacks=[prefetch], max_epochs=1, **trainer_kwargs)
    trainer.fit(model, loader)
    assert len(model.shapes) == 2
    for shape, frames, labels in model.shapes:
        assert shape[0] == 4 and shape[1] % 16 == 0 and shape[2] == 80  # features, frames padded to 16
        assert frames == [(1600 + 160 * k) // 160 + 1 for k in labels]  # each clip's own frame count


def test_the_backward_window_is_open_during_backward_only_and_for_good_after_training(trainer_kwargs):
    """StreamPrefetch opens the window of the training loader's hand-over thread as each backward begins, closes it
    as it ends (forward and the optimizer step launch meanwhile), and opens it for good when training ends."""
    from lightning_gpu_boost.core.handover import BackwardWindow

    prefetch = StreamPrefetch()
    window = prefetch.backward_window = BackwardWindow()  # as a fit with DALI's GPU decode sets it
    states: list[tuple[str, bool]] = []

    class Watch(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            states.append(("forward", window._opened.is_set()))

        def on_before_backward(self, trainer, pl_module, loss):
            states.append(("backward", window._opened.is_set()))

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            states.append(("step", window._opened.is_set()))

    train, _ = _loaders()
    pl.Trainer(callbacks=[prefetch, Watch()], max_steps=3, **trainer_kwargs).fit(RecordingModel(), train)
    assert states[0] == ("forward", True)  # open until the first backward ends
    assert all(opened == (where == "backward") for where, opened in states[1:]), states
    assert window.off == "training ended" and prefetch.backward_window is None
