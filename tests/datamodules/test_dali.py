"""DALIDataModule in real Trainers on real DALI CPU pipelines (and GPU ones on the device)."""

from __future__ import annotations

import sys

import lightning.pytorch as pl
import pytest
import torch

from lightning_gpu_boost.core.dali import rank_indices
from tests.helpers import ImageIdModel, id_dali_datamodule, run_ddp

pytest.importorskip("nvidia.dali", reason="needs the `dali` extra")

from lightning_gpu_boost.datamodules.dali import DALIDataModule


def epochs_of(seen: list[list[int]], per_epoch: int) -> list[list[int]]:
    return [sum(seen[i : i + per_epoch], []) for i in range(0, len(seen), per_epoch)]


@pytest.mark.parametrize("limit, pipelines", [(None, 1), (2, 1), (None, 2), (2, 2)])
def test_three_epochs_exact_sizes_and_each_sample_once(jpeg_tree, trainer_kwargs, limit, pipelines):
    model = ImageIdModel()
    dm = id_dali_datamodule(str(jpeg_tree), batch_size=5, image_size=16, pipelines=pipelines)
    trainer = pl.Trainer(max_epochs=3, limit_train_batches=limit, **trainer_kwargs)
    trainer.fit(model, dm)
    per_epoch = limit or 5
    assert trainer.num_training_batches == per_epoch and len(model.seen["train"]) == 3 * per_epoch
    for epoch, ids in enumerate(epochs_of(model.seen["train"], per_epoch)):
        # each epoch starts at its own beginning, in its own order: nothing shifted by an early stop
        assert ids == rank_indices(24, epoch)[: per_epoch * 5]
    if limit is None:
        assert [len(b) for b in model.seen["train"][:5]] == [5, 5, 5, 5, 4]  # the short last batch is kept


def test_sanity_check_does_not_shift_validation(jpeg_tree, trainer_kwargs):
    model = ImageIdModel()
    dm = id_dali_datamodule(
        str(jpeg_tree), val_root=str(jpeg_tree), batch_size=8, val_batch_size=5, image_size=16
    )
    trainer = pl.Trainer(max_epochs=2, num_sanity_val_steps=2, limit_train_batches=1, **trainer_kwargs)
    trainer.fit(model, dm)
    val = model.seen["val"]
    assert val[:2] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # sanity check: two batches
    for epoch in epochs_of(val[2:], 5):
        assert epoch == list(range(24))  # every validation run covers the set once, in order


def test_float_batches_train_a_real_model(jpeg_tree, trainer_kwargs):
    from lightning_gpu_boost.models import ImageClassifier

    dm = DALIDataModule(str(jpeg_tree), val_root=str(jpeg_tree), batch_size=8, image_size=32, dtype="float32")
    trainer = pl.Trainer(max_epochs=1, **trainer_kwargs)
    trainer.fit(ImageClassifier(num_classes=dm.num_classes), dm)
    assert dm.num_classes == 3 and trainer.global_step == 3
    assert torch.isfinite(trainer.callback_metrics["val_loss"])


@pytest.mark.parametrize("options", [{"decoder_options": {"use_fast_idct": True}}, {"pipeline_options": {"exec_dynamic": False}}])
def test_decode_options_reach_the_pipeline(jpeg_tree, options):
    dm = DALIDataModule(str(jpeg_tree), batch_size=8, image_size=32, device="cpu", **options)
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (8, 3, 32, 32) and images.dtype == torch.float32 and labels.shape == (8,)
    dm.teardown("fit")


def test_lmdb_source_in_a_trainer(jpeg_tree, tmp_path, trainer_kwargs):
    pytest.importorskip("lmdb")
    from lightning_gpu_boost.core.lmdb import pack_image_folder

    pack = pack_image_folder(jpeg_tree, tmp_path / "train.lmdb", progress=False)
    model = ImageIdModel()
    trainer = pl.Trainer(max_epochs=2, **trainer_kwargs)
    trainer.fit(model, id_dali_datamodule(str(pack), batch_size=10, image_size=16, read_threads=3))
    assert [len(b) for b in model.seen["train"]] == [10, 10, 4] * 2
    for epoch, ids in enumerate(epochs_of(model.seen["train"], 3)):
        assert ids == rank_indices(24, epoch)


def test_logs_its_threads(jpeg_tree, monkeypatch):
    from lightning_gpu_boost.datamodules import dali as module

    messages: list[str] = []
    monkeypatch.setattr(module, "node_info", lambda trainer, message: messages.append(message))
    dm = DALIDataModule(
        str(jpeg_tree), batch_size=8, image_size=16, num_threads=2, read_threads=3, device="cpu"
    )
    dm.train_dataloader()
    assert "2 DALI CPU threads + 3 read threads per process" in messages[0]
    assert "pipeline on CPU" in messages[0]


def test_ddp_shards_are_disjoint_complete_with_equal_steps(jpeg_tree, tmp_path):
    results = run_ddp(
        f"""
        import lightning.pytorch as pl
        model = ImageIdModel()
        dm = id_dali_datamodule({str(jpeg_tree)!r}, val_root={str(jpeg_tree)!r}, batch_size=5, image_size=16)
        trainer = pl.Trainer(accelerator="cpu", devices=NPROCS, strategy="ddp", max_epochs=2, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0)
        trainer.fit(model, dm)
        (OUT / f"rank{{trainer.global_rank}}.json").write_text(json.dumps(
            {{"train": model.seen["train"], "val": model.seen["val"], "steps": trainer.global_step}}))
        """,
        tmp_path,
    )
    assert [r["steps"] for r in results] == [6, 6]  # 12 samples per rank: batches of 5, 5, 2, two epochs
    for epoch in (0, 1):
        shards = [sum(r["train"][3 * epoch : 3 * epoch + 3], []) for r in results]
        assert set(shards[0]).isdisjoint(shards[1]) and set(shards[0]) | set(shards[1]) == set(range(24))
        assert shards[0] == rank_indices(24, epoch, 0, 2)
    val = [sum(r["val"][:3], []) for r in results]
    assert sorted(val[0] + val[1]) == list(range(24))


def test_builds_from_lightning_cli_yaml(jpeg_tree, tmp_path, trainer_kwargs):
    pytest.importorskip("jsonargparse")
    from lightning.pytorch.cli import LightningCLI

    from lightning_gpu_boost.models import ImageClassifier

    config = tmp_path / "dali.yaml"
    config.write_text(
        "data:\n"
        "  class_path: lightning_gpu_boost.datamodules.dali.DALIDataModule\n"
        f"  init_args: {{train_root: {str(jpeg_tree)!r}, batch_size: 8, image_size: 32, dtype: float16, "
        "channels_last: true, device: cpu}\n"
    )
    cli = LightningCLI(ImageClassifier, pl.LightningDataModule, subclass_mode_data=True, run=False,
                       args=["--config", str(config), "--trainer.logger=false"])  # fmt: skip
    assert isinstance(cli.datamodule, DALIDataModule)
    assert (cli.datamodule.dtype, cli.datamodule.channels_last) == ("float16", True)


def test_argument_errors(jpeg_tree):
    with pytest.raises(ValueError, match="dtype must be one of"):
        DALIDataModule(str(jpeg_tree), dtype="float64")
    with pytest.raises(ValueError, match="normalize=None"):
        DALIDataModule(str(jpeg_tree), dtype="uint8")
    with pytest.raises(ValueError, match=r"hw_decoder_load must be a number in \[0, 1\], got 2"):
        DALIDataModule(str(jpeg_tree), hw_decoder_load=2)
    with pytest.raises(ValueError, match="device must be 'auto' or 'cpu', got 'gpu'"):
        DALIDataModule(str(jpeg_tree), device="gpu")
    with pytest.raises(ValueError, match="decoder_device must be 'auto', 'mixed' or 'cpu', got 'gpu'"):
        DALIDataModule(str(jpeg_tree), decoder_device="gpu")
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        DALIDataModule(str(jpeg_tree), batch_size=0)
    with pytest.raises(FileNotFoundError):
        DALIDataModule("/no/such/dir").train_dataloader()


@pytest.mark.parametrize("threads, expected", [(4, "mixed"), (8, "cpu")])
def test_auto_decoder_device_follows_the_cpu_threads(jpeg_tree, threads, expected):
    dm = DALIDataModule(str(jpeg_tree), batch_size=8, image_size=32, num_threads=threads)
    dm.train_dataloader()
    assert dm.decoder_in_use == expected
    dm.teardown("fit")
    assert DALIDataModule(str(jpeg_tree), decoder_device="mixed", num_threads=15).decoder_in_use == "mixed"


def test_missing_dali_names_the_extra(jpeg_tree, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # makes `import nvidia.dali` fail
    with pytest.raises(ImportError, match="decoding with NVIDIA DALI") as err:
        DALIDataModule(str(jpeg_tree)).train_dataloader()
    assert "lightning-gpu-boost[dali]" in str(err.value) or "extra `dali`" in str(err.value)
    assert "lightning-gpu-boost[dali-cuda13]" in str(err.value)


# ---------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("decoder_device", ["mixed", "cpu"])
def test_gpu_pipeline_images_are_close_to_cpu_pipeline_images(jpeg_tree, decoder_device):
    def first_batch(device):
        dm = DALIDataModule(
            str(jpeg_tree), val_root=str(jpeg_tree), val_batch_size=24, image_size=64, device=device,
            decoder_device=decoder_device,
        )  # fmt: skip
        return next(iter(dm.val_dataloader()))

    cpu_images, cpu_labels = first_batch("cpu")
    gpu_images, gpu_labels = first_batch("auto")
    assert gpu_images.device.type == "cuda" and gpu_labels.device == gpu_images.device
    assert torch.equal(cpu_labels, gpu_labels.cpu())
    # nvJPEG and libjpeg-turbo differ in IDCT rounding and chroma upsampling, GPU and CPU resizing in rounding:
    # a few levels of 255
    diff = (gpu_images.cpu() - cpu_images).abs().mean() * 0.226 * 255
    assert diff < 3, f"mean difference {diff:.2f} of 255"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_dtypes_and_channels_last_in_a_trainer(jpeg_tree, trainer_kwargs, dtype):
    model = ImageIdModel()
    dm = DALIDataModule(str(jpeg_tree), batch_size=8, image_size=32, dtype=dtype, channels_last=True)
    trainer = pl.Trainer(max_epochs=1, **{**trainer_kwargs, "accelerator": "gpu"})
    trainer.fit(model, dm)
    assert set(model.images) == {(f"torch.{dtype}", (8, 3, 32, 32), "cuda")}
    images, _ = next(iter(dm.train_dataloader()))
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_block_order_of_a_pack_in_a_trainer(jpeg_tree, tmp_path, trainer_kwargs):
    pytest.importorskip("lmdb")
    from lightning_gpu_boost.core.block_shuffle import block_order
    from lightning_gpu_boost.core.lmdb import pack_image_folder

    pack = pack_image_folder(jpeg_tree, tmp_path / "train.lmdb", progress=False)
    n = len(DALIDataModule(str(pack)).source(str(pack)))
    model = ImageIdModel()
    dm = id_dali_datamodule(str(pack), batch_size=5, image_size=16, order="block", window_blocks=2,
                            block_bytes=3 * pack.stat().st_size // n)  # fmt: skip
    trainer = pl.Trainer(max_epochs=2, **trainer_kwargs)
    trainer.fit(model, dm)
    block = dm._block_size(dm.source(str(pack)))
    assert 2 <= block <= 4
    per_epoch = -(-n // 5)
    for epoch, seen in enumerate(epochs_of(model.seen["train"], per_epoch)):
        assert seen == block_order(n, block, 2, seed=0, epoch=epoch)
    with pytest.raises(ValueError, match="order='block' reads runs of consecutive records"):
        DALIDataModule(str(jpeg_tree), order="block")


def test_val_classes_are_checked_against_train_at_construction(jpeg_tree, tmp_path):
    import shutil

    from lightning_gpu_boost.datamodules.dali import DALIDataModule

    val = tmp_path / "val"
    shutil.copytree(jpeg_tree, val)
    shutil.rmtree(val / "class_002")
    with pytest.raises(ValueError, match="val_root's classes differ from train_root's"):
        DALIDataModule(str(jpeg_tree), val_root=str(val), device="cpu")


def test_a_fit_that_ends_with_an_exception_stops_the_dali_threads(jpeg_tree, tmp_path):
    """Lightning calls no teardown when fit raises: on_exception stops the pipelines' threads."""
    import threading

    import lightning.pytorch as pl

    from lightning_gpu_boost.datamodules.dali import DALIDataModule
    from tests.helpers import ImageIdModel

    class Fails(ImageIdModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 1:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    before = {t.ident for t in threading.enumerate()}
    dm = DALIDataModule(str(jpeg_tree), image_size=16, batch_size=4, device="cpu", num_threads=1, read_threads=2)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Fails(), datamodule=dm)
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith(("dali", "lgb"))]
        if not left:
            break
        time.sleep(0.1)
    assert not left, left
    assert not dm._loaders and trainer is not None  # the Trainer is alive: the threads went with the exception
