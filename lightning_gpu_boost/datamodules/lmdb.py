"""``LMDBDataModule``: train from LMDB packs (``lightning-gpu-boost pack``) with the ImageFolder decode path."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Literal

from PIL import Image
from torch.utils.data import Dataset

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost.core.bad_samples import BadSampleTracker
from lightning_gpu_boost.core.lmdb import CorruptRecordError, Record, open_pack, unpack_sample
from lightning_gpu_boost.core.lmdb.checks import check_pack
from lightning_gpu_boost.datamodules.image_folder import (
    ImageFolderDataModule,
    ImageFolderDataset,
    check_image_args,
)

__all__ = ['LMDBDataModule', 'LMDBImageDataset', 'LMDBSampleDataset']


class LMDBImageDataset(ImageFolderDataset):
    """An image pack as ``(uint8 CHW tensor, label)`` pairs, decoded like :class:`ImageFolderDataset` (reduced-size
    JPEG decode, random-resized crop and flip for training; resize + center crop for validation).

    The pack is opened lazily in each process (DataLoader workers under fork or spawn, DDP ranks); records are
    decoded inside the read transaction. ``check_crc`` verifies every record as it is read.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        image_size: int = 224,
        train: bool = True,
        val_resize: int | None = None,
        scale: tuple[float, float] = (0.08, 1.0),
        bad_samples: Literal["raise", "skip"] = "raise",
        check_crc: bool = True,
    ) -> None:
        check_pack("path", path)
        check_image_args(image_size, train, val_resize, scale, bad_samples)
        checks.check_bool("check_crc", check_crc)
        self.reader = open_pack(path, check_crc=check_crc)
        if self.reader.meta("kind") != "image_folder":
            raise ValueError(
                f"{str(path)!r} holds {self.reader.meta('kind')!r} samples, not an image folder pack."
            )
        self.root = str(path)
        self.classes = self.reader.meta("classes")
        self.class_to_idx = self.reader.meta("class_to_idx")
        self.ignored_files = self.reader.meta("ignored_files") or 0
        self.image_size, self.train, self.val_resize = image_size, train, val_resize
        self.scale, self.bad_samples = tuple(scale), bad_samples
        self.bad_sample_tracker = BadSampleTracker(len(self.reader)) if bad_samples == "skip" else None

    def sample_path(self, index: int) -> str:
        """Record ``index``'s original file (relative to the packed folder), from the pack's metadata."""
        return self.reader.source_path(index)

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int):  # type: ignore[override]
        def decode(record: Record):
            return self._load(io.BytesIO(record.payload)), record.label

        try:
            return self.reader.read(index, decode)
        except (CorruptRecordError, OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as err:
            return self.bad(index, err)


class LMDBSampleDataset(Dataset):
    """A pack of general samples (``pack_dataset``), each passed through ``decode`` (default: unchanged)."""

    def __init__(
        self, path: str | os.PathLike, decode: Callable[[Any], Any] | None = None, check_crc: bool = True
    ):
        check_pack("path", path)
        checks.check_callable("decode", decode)
        checks.check_bool("check_crc", check_crc)
        self.reader = open_pack(path, check_crc=check_crc)
        self.decode = decode

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> Any:
        sample = self.reader.read(index, lambda record: unpack_sample(record.payload))
        return self.decode(sample) if self.decode is not None else sample


class LMDBDataModule(ImageFolderDataModule):
    """Image classification from LMDB packs: same batches as :class:`ImageFolderDataModule` (uint8, labels),
    same arguments, with pack files instead of folders. Under DDP Lightning shards it like any Dataset.

    Args:
        train_root: the training pack (``lightning-gpu-boost pack data/train train.lmdb``).
        val_root: the validation pack, or ``None`` (then ``val_split`` may hold out part of the training pack).
        check_crc: verify each record's CRC32 as it is read.
        order: the training order: ``"random"`` (a full shuffle; every record a random read) or ``"block"``
            (:class:`~lightning_gpu_boost.core.block_shuffle.BlockShuffleSampler`: runs of consecutive records
            read together, blocks shuffled each epoch, records shuffled within a window of blocks, DDP shards by
            block, resumable mid-epoch): for packs bigger than the page cache or on network storage.
        block_bytes: bytes per block with ``order="block"`` (records per block from the pack's mean record size).
        window_blocks: blocks shuffled together with ``order="block"``.
        **kwargs: :class:`ImageFolderDataModule` arguments (``image_size``, ``val_split``, ``batch_size``,
            ``num_workers``...).

    Raises:
        FileNotFoundError: a missing pack (names an interrupted ``.partial`` and the resume command).
        IncompletePackError: an interrupted pack.
        ValueError: a pack of general samples, or a bad argument.

    Example::

        >>> import tempfile
        >>> from lightning_gpu_boost.core.images import make_jpeg_folder
        >>> from lightning_gpu_boost.core.lmdb import pack_image_folder
        >>> tmp = tempfile.mkdtemp()
        >>> root = make_jpeg_folder(f"{tmp}/src", n=8, num_classes=2, size_range=(64, 80, 48, 64), progress=False)
        >>> pack = pack_image_folder(root, f"{tmp}/train.lmdb", progress=False)
        >>> images, labels = next(iter(LMDBDataModule(str(pack), image_size=32, batch_size=4, num_workers=0).train_dataloader()))
        >>> tuple(images.shape), images.dtype
        ((4, 3, 32, 32), torch.float32)
    """

    def __init__(
        self,
        train_root: str,
        val_root: str | None = None,
        check_crc: bool = True,
        order: Literal["random", "block"] = "random",
        block_bytes: int = 4 << 20,
        window_blocks: int = 16,
        **kwargs: Any,
    ) -> None:
        checks.check_bool("check_crc", check_crc)
        checks.check_choice("order", order, ("random", "block"))
        checks.check_int("block_bytes", block_bytes, low=1)
        checks.check_int("window_blocks", window_blocks, low=1)
        super().__init__(train_root, val_root, **kwargs)
        self.check_crc = check_crc
        self.order, self.block_bytes, self.window_blocks = order, block_bytes, window_blocks

    _check_root = staticmethod(check_pack)

    def dataloader_kwargs(self, dataset: Any, stage: Any) -> dict[str, Any]:
        """With ``order="block"``, the training loader reads in block-shuffled order (resumable mid-epoch)."""
        kwargs = super().dataloader_kwargs(dataset, stage)
        if stage == "train" and self.order == "block":
            from lightning_gpu_boost.core.block_shuffle import BlockShuffleSampler, block_size_for

            kwargs.pop("shuffle", None)
            block = block_size_for(len(dataset), _pack_bytes(self.train_root, len(dataset)), self.block_bytes)
            sampler = BlockShuffleSampler(dataset, block, self.window_blocks, seed=self.split_seed,
                                          drop_last=bool(kwargs.get("drop_last")))  # fmt: skip
            # blocks are read in one piece, a window ahead of their records (mapped ahead too where this process
            # reads them itself: no workers); with workers, not where the whole pack was asked for when it was
            # opened (it fits in memory): asking again would only take CPU time from the training process
            in_process = not kwargs.get("num_workers")
            if isinstance(dataset, LMDBImageDataset) and (in_process or not getattr(dataset.reader, "read_whole", False)):
                reader = dataset.reader
                sampler.will_need = partial(reader.will_need, populate=True) if in_process else reader.will_need
            kwargs["sampler"] = sampler
        return kwargs

    def _dataset(self, root: str, train: bool) -> ImageFolderDataset:
        return LMDBImageDataset(
            root,
            self.image_size,
            train,
            self.val_resize,
            self.scale,
            self.bad_samples,
            self.check_crc,  # type: ignore[arg-type]
        )


def _pack_bytes(path: str, records: int) -> int:
    """The pack's size on disk (a file, or the files of a folder or of a manifest's shards' folder)."""
    p = Path(path)
    if p.is_file() and p.suffix != ".json":
        return p.stat().st_size
    folder = p if p.is_dir() else p.parent
    total = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    return total or 100_000 * records
