"""StreamingDataModule (``datamodules/streaming.py``) on a real S3 endpoint (moto's server on 127.0.0.1) in a real
Lightning Trainer: every sample once per epoch, the same values a folder gives, exact mid-epoch resume through
litdata's loader state, and the worker count left alone."""

from __future__ import annotations

import pytest

pytest.importorskip("litdata")

import lightning.pytorch as pl
import torch

from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.core.streaming import write_image_stream
from lightning_gpu_boost.datamodules import StreamingDataModule
from tests.helpers import ImageIdModel

N = 24


@pytest.fixture(scope="module")
def stream_url(tmp_path_factory, s3_server):
    """A stream of 24 images, one class each (a label names its sample), in 20 KB chunks, on the S3 endpoint."""
    folder = make_jpeg_folder(tmp_path_factory.mktemp("jpegs"), n=N, num_classes=N, size_range=(64, 80, 48, 64),
                              progress=False)  # fmt: skip
    url = f"s3://{s3_server.bucket('train')}/images"
    write_image_stream(folder, url, chunk_bytes="20KB", num_workers=1, storage_options=s3_server.storage_options,
                       start_method="fork")
    return url


def _dm(url, s3, tmp_path, **kwargs):
    args = {"image_size": 32, "batch_size": 4, "num_workers": 2, "cache_dir": str(tmp_path / "cache"),
            "storage_options": s3.storage_options, **kwargs}  # fmt: skip
    return StreamingDataModule(url, **args)


def test_every_sample_once_per_epoch_from_s3_normalized_on_cpu(stream_url, s3, tmp_path, trainer_kwargs):
    model = ImageIdModel()
    pl.Trainer(max_epochs=2, **trainer_kwargs).fit(model, datamodule=_dm(stream_url, s3, tmp_path))
    epochs = [sum(model.seen["train"][k * 6 : (k + 1) * 6], []) for k in range(2)]
    assert [sorted(e) for e in epochs] == [list(range(N))] * 2  # each sample once per epoch
    assert epochs[0] != epochs[1]  # reshuffled
    assert {dtype for dtype, _, _ in model.images} == {"torch.float32"}  # normalized, as a GPU run's would be


def test_a_run_resumed_mid_epoch_sees_exactly_the_uninterrupted_batches(stream_url, s3, tmp_path, trainer_kwargs):
    kwargs = {**trainer_kwargs, "enable_checkpointing": True}
    every = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1,
                                         filename="{step}")  # fmt: skip
    whole = ImageIdModel()
    pl.Trainer(max_epochs=2, callbacks=[every], **kwargs).fit(whole, datamodule=_dm(stream_url, s3, tmp_path))
    for step in (3, 6, 9):  # mid-epoch in the first epoch, its last batch, mid-epoch in the second
        resumed = ImageIdModel()
        pl.Trainer(max_epochs=2, **kwargs).fit(resumed, datamodule=_dm(stream_url, s3, tmp_path),
                                               ckpt_path=str(tmp_path / "ckpt" / f"step={step}.ckpt"))  # fmt: skip
        assert resumed.seen["train"] == whole.seen["train"][step:], step


def test_a_resume_with_another_worker_count_or_batch_size_is_refused_naming_both(stream_url, s3, tmp_path,
                                                                                trainer_kwargs):  # fmt: skip
    kwargs = {**trainer_kwargs, "enable_checkpointing": True}
    every = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1,
                                         filename="{step}")  # fmt: skip
    pl.Trainer(max_steps=3, callbacks=[every], **kwargs).fit(ImageIdModel(), datamodule=_dm(stream_url, s3, tmp_path))
    for changed, message in (({"num_workers": 1}, "num_workers=2 and this run has num_workers=1"),
                             ({"batch_size": 3}, "batch_size=4 and this run has batch_size=3")):  # fmt: skip
        resumed = ImageIdModel()
        with pytest.raises(ValueError, match=rf"Cannot resume this stream's place: it was saved with {message}"):
            pl.Trainer(max_epochs=2, **kwargs).fit(resumed, datamodule=_dm(stream_url, s3, tmp_path, **changed),
                                                   ckpt_path=str(tmp_path / "ckpt" / "step=3.ckpt"))  # fmt: skip
        assert resumed.seen["train"] == []  # refused before any batch


def test_auto_is_refused_and_auto_num_workers_leaves_the_stream_alone(stream_url, s3, tmp_path, trainer_kwargs):
    from lightning_gpu_boost.callbacks import AutoNumWorkers

    with pytest.raises(ValueError, match=r"num_workers='auto' is not available for StreamingDataModule"):
        _dm(stream_url, s3, tmp_path, num_workers="auto")
    tuner, dm = AutoNumWorkers(use_cache=False), _dm(stream_url, s3, tmp_path, num_workers=1)
    pl.Trainer(max_steps=2, callbacks=[tuner], **trainer_kwargs).fit(ImageIdModel(), datamodule=dm)
    assert tuner.chosen == {} and dm.trainer.train_dataloader.num_workers == 1


def test_a_missing_extra_names_it(stream_url, s3, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "litdata", None)
    dm = _dm(stream_url, s3, tmp_path, check_source=False)
    with pytest.raises(ImportError, match=r"pip install 'lightning-gpu-boost\[stream\]'"):
        dm.train_dataloader()


def test_the_same_images_as_the_folder_in_validation(stream_url, s3, tmp_path):
    dm = _dm(stream_url, s3, tmp_path, val_dir=stream_url, num_workers=0)
    dm.setup("fit")
    images, labels = next(iter(dm.val_dataloader()))  # made outside a Trainer: its workers normalize
    assert images.dtype == torch.float32 and tuple(images.shape[1:]) == (3, 32, 32) and labels.dtype == torch.int64


TWO_NODES = """
import json, sys
from pathlib import Path
sys.path.insert(0, {root!r})
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_gpu_boost.datamodules import StreamingDataModule
from tests.helpers import ImageIdModel

if __name__ == "__main__":  # the whole run, then the run resumed from its step 2, in the same two processes
    ckpt, out = Path({ckpt!r}), Path({out!r})
    common = dict(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp", logger=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=str(out), max_epochs=2)
    runs = {{}}
    for mode in ("whole", "resume"):
        data = StreamingDataModule({url!r}, image_size=32, batch_size=3, num_workers=1, storage_options={options!r},
                                   cache_dir=str(out / "cache"))  # litdata: the same cache path to resume
        model = ImageIdModel()
        if mode == "whole":
            every = ModelCheckpoint(dirpath=str(ckpt), every_n_train_steps=2, save_top_k=-1, filename="{{step}}")
            pl.Trainer(callbacks=[every], **common).fit(model, datamodule=data)
        else:
            pl.Trainer(enable_checkpointing=False, **common).fit(model, datamodule=data,
                                                                 ckpt_path=str(ckpt / "step=2.ckpt"))
        runs[mode] = model.seen["train"]
    (out / f"rank{{model.global_rank}}.json").write_text(json.dumps(runs))
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
"""


def test_two_simulated_nodes_stream_every_sample_once_and_resume_exactly(stream_url, s3, tmp_path):
    import json
    import textwrap

    from tests.strategies.test_two_nodes import ROOT, _two_agents

    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "two_nodes.py"
    script.write_text(textwrap.dedent(TWO_NODES.format(root=str(ROOT), ckpt=str(tmp_path / "ckpt"), out=str(out),
                                                       url=stream_url, options=s3.storage_options)))  # fmt: skip
    _two_agents(script)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    runs = {mode: [rank[mode] for rank in ranks] for mode in ("whole", "resume")}
    steps = len(runs["whole"][0]) // 2  # per epoch, per rank
    for epoch in (0, 1):
        shards = [sum(rank[epoch * steps : (epoch + 1) * steps], []) for rank in runs["whole"]]
        assert sorted(shards[0] + shards[1]) == list(range(N)), epoch  # every sample once across both nodes
    for whole, resumed in zip(runs["whole"], runs["resume"], strict=True):
        assert resumed == whole[2:]  # from the checkpoint at step 2 on: nothing repeated, nothing skipped


class _FirstBatch(ImageIdModel):
    def training_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.first = batch[0].detach().float().cpu()
        return super().training_step(batch, batch_idx)


@pytest.mark.gpu
def test_on_the_gpu_gpu_boost_hands_the_step_the_values_a_cpu_run_gets(tmp_path):
    from lightning_gpu_boost import GPUBoost

    folder = make_jpeg_folder(tmp_path / "jpegs", n=16, num_classes=4, size_range=(64, 80, 48, 64), progress=False)
    write_image_stream(folder, str(tmp_path / "stream"), num_workers=1, start_method="fork")
    runs = {}
    for accelerator, callbacks in (("cpu", []), ("gpu", [GPUBoost(auto_workers=False, watchdog=False)])):
        pl.seed_everything(0)
        model = _FirstBatch()
        dm = StreamingDataModule(str(tmp_path / "stream"), image_size=32, batch_size=8, num_workers=0, shuffle=False,
                                 cache_dir=str(tmp_path / f"cache-{accelerator}"))  # fmt: skip
        pl.Trainer(accelerator=accelerator, devices=1, max_steps=1, callbacks=callbacks, logger=False,
                   enable_checkpointing=False, enable_progress_bar=False).fit(model, datamodule=dm)  # fmt: skip
        runs[accelerator] = model
    assert runs["gpu"].images[0][2] == "cuda" and runs["gpu"].images[0][0] == runs["cpu"].images[0][0]
    torch.testing.assert_close(runs["gpu"].first, runs["cpu"].first, atol=1e-5, rtol=1e-5)


@pytest.mark.timeout(180)
def test_a_chunk_gone_mid_run_raises_naming_it_and_skips_nothing(tmp_path, s3, trainer_kwargs):
    folder = make_jpeg_folder(tmp_path / "jpegs", n=24, num_classes=24, size_range=(64, 80, 48, 64), progress=False)
    url = f"s3://{s3.bucket('gone')}/images"
    write_image_stream(folder, url, chunk_bytes="20KB", num_workers=1, storage_options=s3.storage_options,
                       start_method="fork")
    dm = _dm(url, s3, tmp_path, num_workers=1)
    dm.setup("fit")  # checked while complete: the chunk goes afterwards, as a store's object can
    client = s3.client()
    chunk = sorted(o["Key"] for o in client.list_objects_v2(Bucket="gone", Prefix="images/")["Contents"]
                   if o["Key"].endswith(".bin"))[-1]  # fmt: skip
    client.delete_object(Bucket="gone", Key=chunk)
    model = ImageIdModel()
    with pytest.raises(Exception, match=chunk.split("/")[-1].replace(".", r"\.")):
        pl.Trainer(max_epochs=1, **trainer_kwargs).fit(model, datamodule=dm)
    assert len(sum(model.seen["train"], [])) < N  # the run stopped: no epoch ended with samples missing


@pytest.fixture(scope="session")
def starved_url(tmp_path_factory, s3_server):
    """A stream of 48 images in 16 KB chunks on the S3 endpoint, written once for the tests that read it."""
    folder = make_jpeg_folder(tmp_path_factory.mktemp("starved"), n=48, num_classes=4, size_range=(64, 80, 48, 64),
                              progress=False)  # fmt: skip
    url = f"s3://{s3_server.bucket('starved')}/images"
    write_image_stream(folder, url, chunk_bytes="16KB", num_workers=1, storage_options=s3_server.storage_options,
                       start_method="fork")
    return url


@pytest.fixture
def starved_stream(starved_url, tmp_path, s3):
    """The 48-image stream behind a slow link (150 ms per request, 64 KB/s): a DataModule with one worker reading
    it through the link. At 256 KB/s the whole stream was in the local cache within the doctor's 4 s window, whose
    rest then read locally: the worker decoding kept 0.3-0.5 of its time busy (idle is below 0.5) and a loaded CI
    run read data-bound; at 64 KB/s the window is mostly downloads (0.15-0.21 busy, also beside two CPU hogs)."""
    from urllib.parse import urlparse

    from tests.link_proxy import LinkProxy

    endpoint = urlparse(s3.endpoint)
    proxy = LinkProxy(endpoint.hostname, endpoint.port, latency_s=0.15, bandwidth=64 << 10).start()  # a slow link
    try:
        yield starved_url, _dm(starved_url, s3, tmp_path, num_workers=1,
                               storage_options={**s3.storage_options, "endpoint_url": proxy.url})  # fmt: skip
    finally:
        proxy.stop()


@pytest.mark.timing
def test_the_doctor_tells_a_starved_stream_the_download_side_fixes(starved_stream):
    from lightning_gpu_boost.doctor import diagnose

    url, dm = starved_stream
    # 8 s: the loader alone is measured within half the budget, and a fresh iterator of this stream took 1.6 s to
    # its first batch on the loaded 2-CPU CI machine, which left a 4 s budget's 2 s no batch to time (0 samples/s)
    d = diagnose(dm, ImageIdModel(), budget_s=8, steps=5, accelerator="cpu")
    assert d.verdict == "remote-io-bound", d.format()
    assert f"downloads from {url}" in d.advice[0] and "max_pre_download=4" in d.advice[0], d.format()
    assert d.tuned_workers is None  # a stream's worker count is part of its resume state: not searched


@pytest.mark.timing
def test_the_watchdog_tells_a_starved_stream_the_download_side_fixes(starved_stream, trainer_kwargs):
    from lightning_gpu_boost.callbacks import GPUUtilWatchdog

    url, dm = starved_stream
    dog = GPUUtilWatchdog(window=3, warmup_steps=1)
    pl.Trainer(max_epochs=1, callbacks=[dog], **trainer_kwargs).fit(ImageIdModel(), datamodule=dm)
    assert dog.run_verdict == "remote-io-bound", dog.format_summary()
    assert f"downloads from {url}" in dog.run_advice[0] and "max_pre_download=4" in dog.run_advice[0]
    assert any("num_workers" in a for a in dog.run_advice)  # one worker downloads one chunk at a time
    assert any(w["verdict"] == "remote-io-bound" and "the wait is on downloads" in w["message"] for w in dog.warnings)


class _SlowStep(ImageIdModel):
    """An 80 ms step: a loader of small images keeps up with it, with room for a loaded CI machine's hiccups."""

    def training_step(self, batch, batch_idx):
        import time

        time.sleep(0.08)
        return super().training_step(batch, batch_idx)


@pytest.mark.timing
def test_the_watchdog_stays_quiet_on_a_fed_stream(tmp_path, s3, trainer_kwargs):
    from lightning_gpu_boost.callbacks import GPUUtilWatchdog

    folder = make_jpeg_folder(tmp_path / "jpegs", n=96, num_classes=4, size_range=(64, 80, 48, 64), progress=False)
    url = f"s3://{s3.bucket('fed')}/images"
    write_image_stream(folder, url, chunk_bytes="16KB", num_workers=1, storage_options=s3.storage_options,
                       start_method="fork")
    dog = GPUUtilWatchdog(window=6, warmup_steps=4)
    pl.Trainer(max_epochs=1, callbacks=[dog], **trainer_kwargs).fit(_SlowStep(), datamodule=_dm(url, s3, tmp_path))
    assert len(dog.timeline) >= 3
    assert not [w for w in dog.warnings if w["verdict"] in ("data-bound", "remote-io-bound")], dog.warnings
    assert dog.run_verdict == "ok", dog.format_summary()
