from __future__ import annotations

import shutil

import lightning.pytorch as pl
import pytest
import torch

from lightning_gpu_boost.core.bad_samples import BadSample, BadSampleError
from lightning_gpu_boost.datamodules import ImageFolderDataModule, ImageFolderDataset
from lightning_gpu_boost.models import ImageClassifier


def test_batches_are_uint8_with_correct_labels(jpeg_tree):
    dm = ImageFolderDataModule(str(jpeg_tree), image_size=32, batch_size=8, num_workers=0, shuffle=False,
                               normalize=None)  # fmt: skip
    images, labels = next(iter(dm.train_dataloader()))
    assert images.dtype == torch.uint8 and tuple(images.shape) == (8, 3, 32, 32)
    assert labels.dtype == torch.int64 and labels.tolist() == [0] * 8
    assert dm.num_classes == 3


def test_a_loader_passed_straight_to_fit_hands_normalized_floats(jpeg_tree, trainer_kwargs):
    """Made outside a Trainer, a loader's workers normalize (no callback of ours, no ``datamodule=``): the model
    gets the floats a ``datamodule=`` run gets."""
    from lightning_gpu_boost.core.prefetch import GPUNormalize
    from lightning_gpu_boost.datamodules.image_folder import IMAGENET_MEAN, IMAGENET_STD

    # the validation loader (no random crop) as the training loader: the same images every time
    raw = ImageFolderDataModule(str(jpeg_tree), image_size=32, batch_size=4, num_workers=0, val_split=0.25,
                                normalize=None)  # fmt: skip
    dm = ImageFolderDataModule(str(jpeg_tree), image_size=32, batch_size=4, num_workers=1, val_split=0.25)
    expected = GPUNormalize(IMAGENET_MEAN, IMAGENET_STD)(next(iter(raw.val_dataloader()))[0])
    seen = []

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3 * 32 * 32, 3)

        def training_step(self, batch, i):
            seen.append(batch[0])
            return torch.nn.functional.cross_entropy(self.layer(batch[0].flatten(1)), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    pl.Trainer(max_steps=1, **trainer_kwargs).fit(Model(), dm.val_dataloader())
    assert seen[0].dtype == torch.float32
    torch.testing.assert_close(seen[0], expected)
    with dm.loaders_as_in_a_trainer():  # what the doctor and the benchmarks measure: the loader a Trainer gets
        assert next(iter(dm.val_dataloader()))[0].dtype == torch.uint8


def test_fit_with_val_split_in_a_trainer(jpeg_tree, trainer_kwargs):
    dm = ImageFolderDataModule(str(jpeg_tree), image_size=32, batch_size=4, num_workers=1, val_split=0.25)
    assert len(dm.train_dataset()) == 18 and len(dm.val_dataset()) == 6
    trainer = pl.Trainer(max_epochs=1, **trainer_kwargs)
    trainer.fit(ImageClassifier("small_cnn", num_classes=3), datamodule=dm)
    assert trainer.global_step == 5 and "val_loss" in trainer.callback_metrics


def test_val_root_must_match_classes(jpeg_tree, tmp_path):
    val = tmp_path / "val"
    shutil.copytree(jpeg_tree, val)
    shutil.rmtree(val / "class_002")
    with pytest.raises(ValueError, match=r"val_root's classes differ from train_root's: 2 against 3 .*class_002"):
        ImageFolderDataModule(str(jpeg_tree), val_root=str(val), num_workers=0)  # at construction


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"val_split": 1.0}, r"val_split must be a number in \[0, 1\), got 1.0"),
        ({"image_size": 0}, "image_size must be an int >= 1"),
        ({"bad_samples": "ignore"}, "bad_samples must be one of 'raise', 'skip', got 'ignore'"),
        ({"val_split": 0.1, "val_root": "JPEG_TREE"}, "either val_root or val_split"),
    ],
)
def test_bad_arguments(jpeg_tree, kwargs, match):
    kwargs = {k: str(jpeg_tree) if v == "JPEG_TREE" else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=match):
        ImageFolderDataModule(str(jpeg_tree), **kwargs)
    with pytest.raises(FileNotFoundError, match="val_root must be an existing file or folder, got 'x'"):
        ImageFolderDataModule(str(jpeg_tree), val_root="x")


def test_unreadable_image_raises_or_is_skipped(jpeg_tree, tmp_path):
    root = tmp_path / "tree"
    shutil.copytree(jpeg_tree, root)
    bad = sorted((root / "class_001").glob("*.jpg"))[0]
    bad.write_bytes(b"not a jpeg")
    strict = ImageFolderDataset(root, image_size=16)
    index = [p for p, _ in strict.samples].index(str(bad))
    with pytest.raises(BadSampleError, match="Cannot use sample .*class_001.*bad_samples='skip'"):
        strict[index]
    lenient = ImageFolderDataset(root, image_size=16, bad_samples="skip")
    sample = lenient[index]
    assert isinstance(sample, BadSample) and sample.path == str(bad) and sample.index == index
    assert lenient.bad_sample_tracker.total() == 1
    assert isinstance(lenient[index + 1][0], torch.Tensor), "the next sample is untouched"


def test_empty_tree_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="train_root must be a class-per-folder image tree .*holds no class folder"):
        ImageFolderDataModule(str(tmp_path), num_workers=0)  # at construction
