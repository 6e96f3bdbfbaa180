"""``ImageFolderDataModule``: class-per-folder image trees with a fast uint8 CPU decode path."""

from __future__ import annotations

import os
import random
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from PIL import Image
from torch.utils.data import Dataset, Subset

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost.core.bad_samples import POLICIES, BadSample, BadSampleTracker, bad_sample_error
from lightning_gpu_boost.core.image_sources import check_same_classes
from lightning_gpu_boost.core.images import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    decode_center_crop,
    decode_random_resized_crop,
    scan_image_folder,
)
from lightning_gpu_boost.datamodules.base import BoostDataModule

__all__ = ['ImageFolderDataModule', 'ImageFolderDataset', 'check_image_args']


def check_image_args(image_size: Any, train: Any, val_resize: Any, scale: Any, bad_samples: Any) -> None:
    """The decoding arguments every image dataset shares (folder and LMDB), checked at construction."""
    checks.check_int("image_size", image_size, low=1)
    checks.check_bool("train", train)
    checks.check_int("val_resize", val_resize, low=1, allow_none=True)
    checks.check_pair("scale", scale, low=0.0, high=1.0)
    checks.check_choice("bad_samples", bad_samples, POLICIES)


class ImageFolderDataset(Dataset):
    """``root/<class>/<image>`` files as ``(uint8 CHW tensor, label)`` pairs.

    Args:
        root: the tree (torchvision ``ImageFolder`` layout).
        image_size: output height and width.
        train: random-resized crop + horizontal flip if ``True``; resize + center crop if ``False``.
        val_resize: shorter side before the center crop (default ``image_size / 0.875``).
        scale: area range of the random-resized crop.
        bad_samples: what a file that cannot be read or decoded does: ``"raise"`` an error naming it and the fix,
            or ``"skip"``: :meth:`__getitem__` returns a :class:`~lightning_gpu_boost.core.bad_samples.BadSample`
            that :class:`~lightning_gpu_boost.core.bad_samples.SkipBadCollate` drops from its batch (BoostDataModule
            wraps the collate and reports the count per epoch); :attr:`bad_sample_tracker` counts them across
            worker processes.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        ValueError: an empty tree, a class folder without images, or a bad argument.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        image_size: int = 224,
        train: bool = True,
        val_resize: int | None = None,
        scale: tuple[float, float] = (0.08, 1.0),
        bad_samples: Literal["raise", "skip"] = "raise",
    ) -> None:
        checks.check_image_folder("root", root)
        check_image_args(image_size, train, val_resize, scale, bad_samples)
        self.root = str(root)
        self.samples, self.classes, self.ignored_files = scan_image_folder(root)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.targets = [label for _, label in self.samples]
        self.image_size = image_size
        self.train = train
        self.val_resize = val_resize
        self.scale = tuple(scale)
        self.bad_samples = bad_samples
        #: counts of skipped samples (``bad_samples="skip"`` only: shared memory, passed to every worker)
        self.bad_sample_tracker = BadSampleTracker(len(self.samples)) if bad_samples == "skip" else None

    #: the run record's fact (:mod:`~lightning_gpu_boost.callbacks._run_facts`): samples are uint8 CHW images
    uint8_images = True

    def sample_path(self, index: int) -> str:
        """Sample ``index``'s original file."""
        return self.samples[index][0]

    def __len__(self) -> int:
        return len(self.samples)

    def _load(self, path: Any) -> torch.Tensor:
        """Decode ``path`` (a path or a binary file object) for training or validation."""
        if self.train:
            return decode_random_resized_crop(path, self.image_size, scale=self.scale, rng=random)
        return decode_center_crop(path, self.image_size, self.val_resize)

    def bad(self, index: int, err: BaseException) -> BadSample:
        """Apply the ``bad_samples`` policy to sample ``index`` that failed with ``err``."""
        path = self.sample_path(index)
        reason = str(err).split(" <_io.BytesIO")[0] or type(err).__name__
        if self.bad_samples == "raise":
            raise bad_sample_error(index, path, self.root, reason) from err
        self.bad_sample_tracker.mark(index)
        return BadSample(index, path, reason)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int] | BadSample:
        path, label = self.samples[index]
        try:
            return self._load(path), label
        except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as err:
            return self.bad(index, err)


class ImageFolderDataModule(BoostDataModule):
    """Image classification from class-per-folder trees, decoded fast on the CPU into uint8 batches.

    Batches are ``(images, labels)``: ``images`` is ``uint8`` of shape ``(N, 3, image_size, image_size)``,
    ``labels`` is ``int64`` of shape ``(N,)``. Normalize on the GPU with ``StreamPrefetch()`` or ``GPUBoost()`` in
    the Trainer's callbacks (the default ``normalize`` is ImageNet's mean/std); without them the DataModule
    normalizes after the batch's transfer, on its device; a loader made outside a Trainer, in its workers.

    Decoding asks JPEG for the smallest DCT scale that still covers the crop (``Image.draft``), crops and resizes
    in one Pillow call and never leaves uint8: measured 1.3x+ the images/s of torchvision's ``ImageFolder`` with
    ``RandomResizedCrop/flip/ToTensor/Normalize`` at the same worker count (``benchmarks/image_folder.py``).

    Args:
        train_root: training tree ``<train_root>/<class>/<image>``.
        val_root: validation tree with the same class folders, or ``None``.
        val_split: fraction of ``train_root`` held out for validation when ``val_root`` is ``None`` (0 = none).
        image_size: crop size.
        val_resize: shorter side before the validation center crop (default ``image_size / 0.875``).
        scale: area range of the training random-resized crop.
        bad_samples: a file that cannot be read or decoded: ``"raise"`` an error naming it, or ``"skip"`` it: it is
            dropped and the next samples take its place (batches stay full; no good sample is repeated or lost), counted per
            epoch (logged as ``bad_samples/train`` and ``bad_samples/val``) and named in one warning per epoch.
        split_seed: seed of the ``val_split`` partition.
        **kwargs: :class:`~lightning_gpu_boost.datamodules.BoostDataModule` arguments (``batch_size``,
            ``num_workers``, ``pin_memory``, ...).

    Raises:
        ValueError: a bad argument, an empty tree, a class folder without images, or train/val class mismatch.
        FileNotFoundError: a root that does not exist.

    Example::

        >>> import tempfile
        >>> from lightning_gpu_boost.core.images import make_jpeg_folder
        >>> root = make_jpeg_folder(tempfile.mkdtemp(), n=8, num_classes=2, progress=False)
        >>> dm = ImageFolderDataModule(root, image_size=64, batch_size=4, num_workers=0)
        >>> images, labels = next(iter(dm.train_dataloader()))
        >>> images.dtype, tuple(images.shape), labels.dtype
        (torch.float32, (4, 3, 64, 64), torch.int64)
    """

    def __init__(
        self,
        train_root: str,
        val_root: str | None = None,
        val_split: float = 0.0,
        image_size: int = 224,
        val_resize: int | None = None,
        scale: tuple[float, float] = (0.08, 1.0),
        bad_samples: Literal["raise", "skip"] = "raise",
        split_seed: int = 0,
        normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = (IMAGENET_MEAN, IMAGENET_STD),
        **kwargs,
    ) -> None:
        self._check_root("train_root", train_root)
        self._check_root("val_root", val_root, allow_none=True)
        checks.check_number("val_split", val_split, low=0.0, high=1.0, high_open=True)
        checks.check_int("image_size", image_size, low=1)
        checks.check_int("val_resize", val_resize, low=1, allow_none=True)
        checks.check_pair("scale", scale, low=0.0, high=1.0)
        checks.check_choice("bad_samples", bad_samples, POLICIES)
        checks.check_int("split_seed", split_seed, low=0)
        super().__init__(normalize=normalize, **kwargs)
        if val_root is not None and val_split:
            raise ValueError(f"Give either val_root or val_split, not both (val_root={val_root!r}, "
                             f"val_split={val_split!r}).")  # fmt: skip
        check_same_classes(train_root, val_root)
        self.train_root = str(train_root)
        self.val_root = None if val_root is None else str(val_root)
        self.val_split = val_split
        self.image_size = image_size
        self.val_resize = val_resize
        self.scale = tuple(scale)
        self.bad_samples = bad_samples
        self.split_seed = split_seed
        self._datasets: dict[str, Dataset] = {}

    #: what ``train_root`` and ``val_root`` must be (LMDBDataModule: packs)
    _check_root = staticmethod(checks.check_image_folder)

    def _dataset(self, root: str, train: bool) -> ImageFolderDataset:
        return ImageFolderDataset(
            root,
            self.image_size,
            train,
            self.val_resize,
            self.scale,
            self.bad_samples,  # type: ignore[arg-type]
        )

    def _build(self) -> None:
        if self._datasets:
            return
        train = self._dataset(self.train_root, train=True)
        if train.ignored_files:
            rank_zero_info(
                f"{type(self).__name__}: ignored {train.ignored_files} non-image files in {self.train_root}"
            )
        self.classes = train.classes
        if self.val_root is not None:
            val = self._dataset(self.val_root, train=False)
            if val.classes != train.classes:
                missing = sorted(set(train.classes) ^ set(val.classes))
                raise ValueError(
                    f"Class folders differ between train_root and val_root (differing: {missing[:5]}); "
                    "labels would not match."
                )
            self._datasets = {"train": train, "val": val}
        elif self.val_split:
            order = torch.randperm(
                len(train), generator=torch.Generator().manual_seed(self.split_seed)
            ).tolist()
            n_val = max(1, int(round(len(train) * self.val_split)))
            val = self._dataset(self.train_root, train=False)
            self._datasets = {"train": Subset(train, order[n_val:]), "val": Subset(val, order[:n_val])}
        else:
            self._datasets = {"train": train}

    @property
    def num_classes(self) -> int:
        self._build()
        return len(self.classes)

    def train_dataset(self) -> Dataset:
        self._build()
        return self._datasets["train"]

    def val_dataset(self) -> Dataset | None:
        self._build()
        return self._datasets.get("val")
