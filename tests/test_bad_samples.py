"""Bad samples: found at pack time and named by path; skipped (counted, every good sample once) or raised, on
folder, LMDB and DALI sources; unusual images decode to upright RGB the same way in every reader."""

from __future__ import annotations

import json
import os
import shutil

import lightning.pytorch as pl
import pytest
import torch
from PIL import Image, ImageOps

from lightning_gpu_boost.callbacks import BadSampleReport
from lightning_gpu_boost.cli import main
from lightning_gpu_boost.core import lmdb as lf
from lightning_gpu_boost.core.bad_samples import (
    BROKEN_KINDS,
    BadSampleError,
    add_broken_files,
    add_unusual_images,
    check_image,
)
from lightning_gpu_boost.core.images import decode_center_crop, make_jpeg_folder
from lightning_gpu_boost.core.lmdb import pack as lw
from lightning_gpu_boost.datamodules import ImageFolderDataModule

GOOD = 294  # + 6 broken files (one per kind) = 2 % broken


@pytest.fixture(scope="module")
def broken_tree(tmp_path_factory):
    root = make_jpeg_folder(
        tmp_path_factory.mktemp("broken") / "src", n=GOOD, num_classes=3, size_range=(48, 80, 40, 64), progress=False
    )
    return str(root), add_broken_files(root)


def test_every_broken_kind_fails_the_structure_check_and_good_images_pass(broken_tree, tmp_path):
    root, broken = broken_tree
    assert len(broken) == len(BROKEN_KINDS)
    for rel in broken:
        path = os.path.join(root, rel)
        data = open(path, "rb").read() if os.path.exists(path) else None
        if data is not None:
            assert check_image(data) is not None, rel
    for path in add_unusual_images(tmp_path).values():
        data = open(path, "rb").read()
        assert check_image(data) is None and check_image(data, "decode") is None, path
    jpeg = open(os.path.join(root, "class_000", sorted(os.listdir(os.path.join(root, "class_000")))[-1]), "rb").read()
    assert check_image(jpeg + b"trailer after the end marker") is None  # phone cameras append data


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


def test_refill_reforms_full_batches_of_any_structure_each_sample_once():
    from collections import namedtuple

    from lightning_gpu_boost.core.bad_samples import (
        BadSample,
        Refill,
        SkipBadCollate,
        batch_layout,
        can_refill,
    )

    Pair = namedtuple("Pair", "x y")

    def sample(i):
        return {"x": torch.full((3, 2), float(i)), "id": i, "name": f"s{i}", "pair": Pair(torch.tensor(i), [i])}

    collate = SkipBadCollate(refill=True)
    bad = {3, 4, 5, 6, 7, 8, 9, 21}  # a whole batch and more bad
    batches = [collate([BadSample(i, "p", "r") if i in bad else sample(i) for i in range(j, min(j + 4, 30))])
               for j in range(0, 30, 4)]  # fmt: skip
    assert batches[1].n == 0 and batches[0].n == 3
    out = list(Refill(batches, 4, expected=len(batches)))
    assert len(out) == len(batches) == 8
    ids = [int(i) for b in out for i in b["id"]]
    assert ids == [i for i in range(30) if i not in bad]  # each good sample once, in order
    assert [len(b["id"]) for b in out] == [4, 4, 4, 4, 2, 2, 1, 1]
    for b in out:  # every part of a sample stays with it
        mine = b["id"].tolist()
        assert [int(v) for v in b["x"][:, 0, 0]] == mine == b["pair"].x.tolist() == b["pair"].y[0].tolist()
        assert b["name"] == [f"s{i}" for i in mine] and isinstance(b["pair"], Pair)
    # nothing skipped: the batches pass through untouched
    clean = [collate([sample(i) for i in range(j, j + 4)]) for j in range(0, 16, 4)]
    assert [b is c.batch for b, c in zip(Refill(clean, 4, 4), clean, strict=True)] == [True] * 4
    # three variable-size CHW images in a list: a list of samples, never sliced along channels
    images = [torch.zeros(3, 5 + k, 4) for k in range(3)]
    assert batch_layout(images[:1], images, 3) == "L"
    # padding that depends on the batch cannot be re-formed: short batches go on as they are, with a warning
    assert not can_refill(batch_layout(torch.zeros(1, 5), torch.zeros(3, 9), 3))
    warned = []
    padded = SkipBadCollate(lambda s: torch.nn.utils.rnn.pad_sequence(s, batch_first=True), refill=True)
    seqs = [padded([torch.ones(k + 1) for k in range(j, j + 3)]) for j in (0, 3)]
    seqs[0] = padded([torch.ones(1), BadSample(1, "p", "r"), torch.ones(3)])
    assert [len(b) for b in Refill(seqs, 3, 2, warn=warned.append)] == [2, 3] and len(warned) == 1
    # ... also where a batch's first sample is its longest (it looks cuttable alone): its width differs from the
    # next batch's, so nothing is joined across them
    seqs = [padded([torch.ones(3), BadSample(1, "p", "r"), torch.ones(1)]), padded([torch.ones(2)] * 2 + [torch.ones(1)])]
    warned.clear()
    assert [tuple(b.shape) for b in Refill(seqs, 3, 2, warn=warned.append)] == [(2, 3), (3, 2)] and len(warned) == 1


def test_refill_keeps_pinned_memory_pinned():
    if not torch.cuda.is_available():
        pytest.skip("pinning needs CUDA")
    from lightning_gpu_boost.core.bad_samples import Counted, Refill

    parts = [Counted(torch.arange(k).pin_memory(), k, "B") for k in (3, 4, 4)]
    out = list(Refill(parts, 4, 3))
    assert [len(b) for b in out] == [4, 4, 3] and all(b.is_pinned() for b in out)


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
