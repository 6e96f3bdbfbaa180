"""Bad samples: found at pack time and named by path; skipped (counted, every good sample once) or raised, on
folder, LMDB and DALI sources; unusual images decode to upright RGB the same way in every reader."""

from __future__ import annotations

import json
import shutil

import lightning.pytorch as pl
import pytest
import torch
from PIL import Image, ImageOps

from lightning_gpu_boost.callbacks import BadSampleReport
from lightning_gpu_boost.cli import main
from lightning_gpu_boost.core import lmdb as lf
from lightning_gpu_boost.core.bad_samples import (
    BadSampleError,
    add_unusual_images,
)
from lightning_gpu_boost.core.images import decode_center_crop
from lightning_gpu_boost.core.lmdb import pack as lw
from lightning_gpu_boost.datamodules import ImageFolderDataModule
from tests.conftest import BROKEN_TREE_GOOD as GOOD


class Counting(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)
        self.seen: dict[int, int] = {}
        self.sizes: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        images, labels = batch
        self.seen[self.current_epoch] = self.seen.get(self.current_epoch, 0) + len(labels)
        self.sizes.setdefault(self.current_epoch, []).append(len(labels))
        return self.layer(images.float().mean((2, 3))).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _assert_full_batches(model, total: int, size: int) -> None:
    """Skipped samples' places are taken by the next samples: as many batches as the loader's length, full but
    for the last few (the samples left after the last full batch, spread over the batches still owed)."""
    batches = -(-total // size)
    for sizes in model.sizes.values():
        assert len(sizes) == batches, sizes
        tail = next(i for i, k in enumerate(sizes) if k != size)
        assert tail >= batches - 3 and all(0 < k <= size for k in sizes[tail:]), sizes


def _fit(dm, epochs: int = 2):
    model = Counting()
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[BadSampleReport()])  # fmt: skip
    trainer.fit(model, dm)
    return model, trainer


def test_pack_skips_and_lists_exactly_the_broken_files(broken_tree, tmp_path, capsys):
    root, broken = broken_tree
    assert main(["pack", root, str(tmp_path / "a.lmdb")]) == 0
    out = capsys.readouterr().out
    assert f"{GOOD} records" in out and f"skipped {len(broken)} bad files" in out
    reader = lf.open_pack(tmp_path / "a.lmdb")
    listed = reader.meta("bad_samples")
    assert sorted(entry["path"] for entry in listed) == broken and all(entry["reason"] for entry in listed)
    report = json.loads((tmp_path / "a.lmdb.bad-samples.json").read_text())
    assert report["bad_samples"] == listed
    assert len(reader) == GOOD and all(not reader.source_path(i).startswith("broken") for i in range(len(reader)))
    assert lf.verify(tmp_path / "a.lmdb", decode=True)["undecodable_records"] == 0


def test_pack_fails_at_once_naming_the_file(broken_tree, tmp_path, capsys):
    root, broken = broken_tree
    assert main(["pack", root, str(tmp_path / "b.lmdb"), "--on-bad", "fail"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (the lines before: the progress bar)
    assert last.startswith("lightning-gpu-boost: error: Bad file") and broken[0].split("/")[-1] in last
    assert "--on-bad skip" in last


def test_resume_keeps_what_the_policy_decided(broken_tree, tmp_path, monkeypatch):
    root, broken = broken_tree
    real, calls = lw._read_records, []

    def crash_on_the_third_window(items, *args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # like a kill between commits
        return real(items, *args)

    monkeypatch.setattr(lw, "_read_records", crash_on_the_third_window)
    with pytest.raises(KeyboardInterrupt):
        lf.pack_image_folder(root, tmp_path / "c.lmdb", commit_every=100, workers=0, progress=False)
    monkeypatch.setattr(lw, "_read_records", real)
    lf.pack_image_folder(root, tmp_path / "c.lmdb", commit_every=100, workers=0, resume=True, progress=False)
    reader = lf.open_pack(tmp_path / "c.lmdb")
    assert sorted(e["path"] for e in reader.meta("bad_samples")) == broken and len(reader) == GOOD
    whole = lf.open_pack(lf.pack_image_folder(root, tmp_path / "d.lmdb", progress=False))
    assert [reader.read(i) for i in range(GOOD)] == [whole.read(i) for i in range(GOOD)]


def test_verify_decode_names_undecodable_records(broken_tree, tmp_path, capsys):
    root, broken = broken_tree
    lf.pack_image_folder(root, tmp_path / "raw.lmdb", check="none", progress=False)  # broken files packed as-is
    assert main(["verify", str(tmp_path / "raw.lmdb"), "--decode"]) == 1
    summary = json.loads(capsys.readouterr().out)
    named = sorted(entry["path"] for entry in summary["undecodable"])
    assert summary["undecodable_records"] == len(broken) - 1  # the dangling link has no bytes to pack
    assert named == [p for p in broken if "dangling" not in p]


@pytest.mark.parametrize("source", ["folder", "lmdb"])
def test_skip_trains_every_good_sample_each_epoch_and_raise_names_the_file(broken_tree, tmp_path, source):
    from lightning_gpu_boost.datamodules import LMDBDataModule

    root, broken = broken_tree
    if source == "lmdb":  # a pack that holds the broken files (packed unchecked)
        root = str(lf.pack_image_folder(root, tmp_path / "raw.lmdb", check="none", progress=False))
    cls = ImageFolderDataModule if source == "folder" else LMDBDataModule
    dm = cls(root, image_size=16, batch_size=8, num_workers=2, bad_samples="skip")
    with pytest.warns(UserWarning, match="Epoch 1: skipped 5 bad train samples|Epoch 1: skipped 6 bad train samples"):
        model, trainer = _fit(dm)
    bad = len(broken) - (source == "lmdb")  # the dangling link is not in the pack
    assert model.seen == {0: GOOD, 1: GOOD}
    _assert_full_batches(model, GOOD + bad, 8)
    assert trainer.callback_metrics["bad_samples/train"] == bad
    with pytest.raises(BadSampleError, match="broken-.*bad_samples='skip'"):
        _fit(cls(root, image_size=16, batch_size=8, num_workers=0), epochs=1)


def test_dali_skip_and_raise(broken_tree):
    pytest.importorskip("nvidia.dali")
    from lightning_gpu_boost.datamodules import DALIDataModule

    root, broken = broken_tree
    dm = DALIDataModule(root, image_size=16, batch_size=8, bad_samples="skip", device="cpu", num_threads=2,
                        read_threads=2)  # fmt: skip
    model, trainer = _fit(dm)
    assert model.seen == {0: GOOD, 1: GOOD} and trainer.callback_metrics["bad_samples/train"] == len(broken)
    _assert_full_batches(model, GOOD + len(broken), 8)
    with pytest.raises(BadSampleError, match="broken-.*bad_samples='skip'"):
        _fit(DALIDataModule(root, image_size=16, batch_size=8, device="cpu", num_threads=2), epochs=1)


def test_unusual_images_decode_upright_rgb_in_every_reader(tmp_path):
    folder = tmp_path / "src" / "a"
    folder.mkdir(parents=True)
    paths = add_unusual_images(folder)
    for kind, path in paths.items():
        out = decode_center_crop(path, 32, 32)
        assert out.shape == (3, 32, 32) and out.dtype == torch.uint8, kind
    with Image.open(paths["exif_rotated"]) as img:  # stored 48 x 64, shown 64 x 48
        upright = ImageOps.exif_transpose(img)
        upright.save(tmp_path / "upright.png")
    assert (decode_center_crop(paths["exif_rotated"], 32, 32).float()
            - decode_center_crop(tmp_path / "upright.png", 32, 32).float()).abs().mean() < 3  # fmt: skip
    pack = lf.open_pack(lf.pack_image_folder(tmp_path / "src", tmp_path / "u.lmdb", progress=False))
    assert len(pack) == len(paths), pack.meta("bad_samples")
    from lightning_gpu_boost.datamodules.lmdb import LMDBImageDataset

    dataset = LMDBImageDataset(tmp_path / "u.lmdb", image_size=32, train=False, val_resize=32)
    for i in range(len(dataset)):
        folder_image = decode_center_crop(tmp_path / "src" / pack.source_path(i), 32, 32)
        assert torch.equal(dataset[i][0], folder_image)
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return
    from lightning_gpu_boost.datamodules import DALIDataModule

    dm = DALIDataModule(str(tmp_path / "src"), val_root=str(tmp_path / "src"), image_size=32, val_resize=32,
                        batch_size=len(paths), normalize=None, dtype="uint8", device="cpu", num_threads=1)  # fmt: skip
    images, _ = next(iter(dm.val_dataloader()))
    source = dm._loaders["val"].source
    for i in range(len(source)):
        ours = decode_center_crop(source.sample_path(i), 32, 32).float()
        assert images[i].shape == (3, 32, 32) and (images[i].float() - ours).abs().mean() < 4, source.sample_path(i)


def test_a_pack_of_copied_trees_is_unchanged_without_bad_files(tmp_path, jpeg_tree):
    root = tmp_path / "tree"
    shutil.copytree(jpeg_tree, root)
    reader = lf.open_pack(lf.pack_image_folder(root, tmp_path / "p.lmdb", progress=False))
    assert reader.meta("bad_samples") == [] and not (tmp_path / "p.lmdb.bad-samples.json").exists()


def test_skip_under_ddp_keeps_every_rank_in_step_with_full_batches(broken_tree, tmp_path):
    from tests.helpers import run_ddp

    root, broken = broken_tree
    results = run_ddp(
        f"""
        import lightning.pytorch as pl
        from lightning_gpu_boost.callbacks import BadSampleReport
        from lightning_gpu_boost.datamodules import ImageFolderDataModule
        from lightning_gpu_boost.models import ImageClassifier
        class Spy(pl.Callback):
            sizes = []
            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                self.sizes.append(len(batch[1]))
        dm = ImageFolderDataModule({root!r}, image_size=16, batch_size=8, num_workers=1, bad_samples="skip")
        trainer = pl.Trainer(accelerator="cpu", devices=NPROCS, strategy="ddp", max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[Spy(), BadSampleReport()])
        trainer.fit(ImageClassifier("small_cnn", num_classes=3), datamodule=dm)
        loader = trainer.train_dataloader
        (OUT / f"rank{{trainer.global_rank}}.json").write_text(json.dumps(
            {{"sizes": Spy.sizes, "loader": type(loader).__name__, "len": len(loader),
              "bad": float(trainer.callback_metrics["bad_samples/train"])}}))
        """,
        tmp_path,
    )
    per_rank = (GOOD + len(broken)) // 2  # 150 each: 19 batches of 8 (the last 6)
    assert [r["len"] for r in results] == [19, 19] and all(r["loader"] == "RefillDataLoader" for r in results)
    assert sum(r["bad"] for r in results) == len(broken)
    for r in results:
        sizes = r["sizes"]
        assert len(sizes) == 19 and sum(sizes) == per_rank - r["bad"]
        assert all(k == 8 for k in sizes[:-2]), sizes


@pytest.mark.gpu
@pytest.mark.parametrize("decoder_device", ["mixed", "cpu"])
@pytest.mark.parametrize("source", ["folder", "lmdb"])
def test_dali_gpu_pipeline_skips_bad_samples_with_full_batches(broken_tree, tmp_path, decoder_device, source):
    pytest.importorskip("nvidia.dali")
    from lightning_gpu_boost.datamodules import DALIDataModule

    root, broken = broken_tree
    bad = len(broken)
    if source == "lmdb":
        root, bad = str(lf.pack_image_folder(root, tmp_path / "raw.lmdb", check="none", progress=False)), bad - 1
    kwargs = {"image_size": 16, "batch_size": 8, "decoder_device": decoder_device, "num_threads": 2}
    dm = DALIDataModule(root, bad_samples="skip", **kwargs)
    model = Counting()
    trainer = pl.Trainer(max_epochs=2, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[BadSampleReport()])  # fmt: skip
    trainer.fit(model, dm)
    assert model.seen == {0: GOOD, 1: GOOD} and trainer.callback_metrics["bad_samples/train"] == bad
    _assert_full_batches(model, GOOD + bad, 8)
    with pytest.raises(BadSampleError, match="broken-"):
        _fit_gpu = pl.Trainer(max_epochs=1, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                              enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
        _fit_gpu.fit(Counting(), DALIDataModule(root, **kwargs))
