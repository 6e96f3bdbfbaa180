from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

pytest.importorskip("lmdb")

from lightning_gpu_boost.core.lmdb import pack_dataset, pack_image_folder
from lightning_gpu_boost.datamodules import ImageFolderDataModule, LMDBDataModule, LMDBSampleDataset
from lightning_gpu_boost.models import ImageClassifier
from tests.helpers import run_ddp


@pytest.fixture(scope="module")
def pack(jpeg_tree, tmp_path_factory):
    return str(pack_image_folder(jpeg_tree, tmp_path_factory.mktemp("lmdb") / "train.lmdb", progress=False))


def test_same_validation_batches_as_the_folder(jpeg_tree, pack):
    kwargs = {"image_size": 32, "batch_size": 8, "num_workers": 0, "shuffle": False}
    folder = ImageFolderDataModule(str(jpeg_tree), val_root=str(jpeg_tree), **kwargs)
    packed = LMDBDataModule(pack, val_root=pack, **kwargs)
    for (a, la), (b, lb) in zip(folder.val_dataloader(), packed.val_dataloader(), strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert packed.num_classes == 3


def test_fits_in_a_trainer_with_workers(pack, trainer_kwargs):
    dm = LMDBDataModule(pack, image_size=32, batch_size=4, num_workers=2, val_split=0.25)
    trainer = pl.Trainer(max_epochs=1, **trainer_kwargs)
    trainer.fit(ImageClassifier("small_cnn", num_classes=3), datamodule=dm)
    assert trainer.global_step == 5 and "val_loss" in trainer.callback_metrics


def test_general_samples_with_a_decode_function(tmp_path):
    path = pack_dataset(
        [{"x": torch.full((3,), float(i)), "y": i} for i in range(5)], tmp_path / "s.lmdb", progress=False
    )
    ds = LMDBSampleDataset(path, decode=lambda s: (torch.from_numpy(s["x"].copy()), s["y"]))
    x, y = ds[4]
    assert y == 4 and x.tolist() == [4.0, 4.0, 4.0]
    with pytest.raises(ValueError, match="not an image folder pack"):
        LMDBDataModule(str(path), num_workers=0).train_dataset()


def test_ddp_shards_the_pack(pack, tmp_path):
    results = run_ddp(
        f"""
        import lightning.pytorch as pl
        from lightning_gpu_boost.datamodules import LMDBDataModule
        from lightning_gpu_boost.models import ImageClassifier
        class Spy(pl.Callback):
            labels = []
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                self.labels.append(len(batch[1]))
        dm = LMDBDataModule({pack!r}, image_size=32, batch_size=4, num_workers=1)
        trainer = pl.Trainer(accelerator="cpu", devices=NPROCS, strategy="ddp", max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[Spy()])
        trainer.fit(ImageClassifier("small_cnn", num_classes=3), datamodule=dm)
        (OUT / f"rank{{trainer.global_rank}}.json").write_text(json.dumps({{"samples": sum(Spy.labels)}}))
        """,
        tmp_path,
    )
    assert [r["samples"] for r in results] == [12, 12]
