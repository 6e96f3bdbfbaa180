"""``StreamingDataModule``: images streamed from object storage (or a local folder) through litdata, decoded into
uint8 batches in the loader's workers."""

from __future__ import annotations

from typing import Any, Literal

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost.core.images import IMAGENET_MEAN, IMAGENET_STD
from lightning_gpu_boost.datamodules.base import BoostDataModule

__all__ = ["StreamingDataModule"]


class StreamingDataModule(BoostDataModule):
    """Image classification from a litdata stream: ``s3://bucket/prefix`` on AWS or any S3-compatible store, or a
    local folder, read by litdata's ``StreamingDataset`` / ``StreamingDataLoader`` (chunks downloaded ahead into a
    local cache, shuffled by chunk and within a window, split across workers, ranks and nodes by litdata).

    Batches are ``(images, labels)``: ``uint8`` ``(N, 3, image_size, image_size)`` and ``int64`` ``(N,)``, decoded
    in the workers as ``ImageFolderDataModule`` decodes files; ``StreamPrefetch()`` / ``GPUBoost()`` normalize them
    on the GPU (without them, after the batch's transfer, on its device). Write a stream from an image folder with
    :func:`~lightning_gpu_boost.core.streaming.write_image_stream`.

    Before training (``setup``) each stream is checked: an unreachable endpoint, missing credentials, a bucket or
    prefix that does not exist, an upload that stopped before its end, or samples of another schema raises one
    :class:`~lightning_gpu_boost.core.streaming.StreamSourceError` naming the URL. In training each sample's
    checksum (written by ``write_image_stream``) is compared in the worker that reads it: a damaged sample is named
    by its object (chunk), its place and the cause, and raised or skipped by ``bad_samples``. A read that waits more
    than ``stall_s`` is reported from the worker, naming the object and the endpoint, while it is retried. A
    training run resumed from a mid-epoch checkpoint continues where it stopped through litdata's own loader state,
    which Lightning saves; a resume with another worker count, batch size, world size, stream, seed or shuffle is
    refused with one line naming both values.

    Logged: one info line per stream with its samples, chunks and bytes; one warning for a stream written without
    checksums; with ``bad_samples="skip"``, one warning per pass naming the samples skipped (and
    ``bad_samples/train`` through ``BadSampleReport``, part of ``GPUBoost``).

    Args:
        train_dir: the training stream (``s3://bucket/prefix`` or a folder holding ``index.json``).
        val_dir: the validation stream, or ``None``.
        image_size: crop size.
        val_resize: validation resize of the shorter side before the center crop (default ``image_size / 0.875``).
        scale: random-resized-crop area range for training.
        storage_options: litdata's client settings (``endpoint_url``, ``aws_access_key_id``, ...); ``None`` uses
            the environment (``AWS_*`` variables, profiles).
        cache_dir: where downloaded chunks are kept (a local NVMe disk); ``None``: litdata's default.
        max_cache_size: most bytes the chunk cache holds, litdata's format (``"100GB"``).
        max_pre_download: chunks each worker downloads ahead.
        seed: the shuffle's seed (litdata's ``seed``; each epoch reshuffles from it).
        check_source: check each stream in ``setup`` (one listing and the index: a few requests).
        bad_samples: a sample whose checksum does not match, whose record does not parse or whose image does not
            decode: ``"raise"`` an error naming its object, place and cause, or ``"skip"`` it (its batch is that much
            shorter).
        stall_s: seconds a sample may wait for its bytes before the stall is reported (and, where litdata
            downloads with boto3, before a silent request is retried).
        normalize: ``(mean, std)`` per channel in ``[0, 1]`` units (ImageNet's by default), or ``None``.
        **kwargs: :class:`~lightning_gpu_boost.datamodules.BoostDataModule`'s (``batch_size``, ``num_workers``,
            ``pin_memory``, ``persistent_workers``, ``prefetch_factor``, ``drop_last``, ``shuffle``, ``collate_fn``).
            ``num_workers`` is an int or ``None`` (the usable-CPU default): litdata's resume state and its split of
            chunks across workers depend on the count, so it is never changed during a run (``"auto"`` is refused,
            and ``AutoNumWorkers`` leaves this loader alone, saying so).

    Raises:
        ValueError: an argument is out of range (the message names it, its value and what is valid).
        ImportError: litdata (the ``stream`` extra) is not installed, when a loader is first built.

    Example::

        >>> import tempfile
        >>> from lightning_gpu_boost.core.images import make_jpeg_folder
        >>> from lightning_gpu_boost.core.streaming import write_image_stream
        >>> tmp = tempfile.mkdtemp()
        >>> folder = make_jpeg_folder(f"{tmp}/jpegs", n=16, num_classes=2, size_range=(64, 80, 48, 64), progress=False)
        >>> _ = write_image_stream(folder, f"{tmp}/stream", num_workers=1)
        >>> dm = StreamingDataModule(f"{tmp}/stream", image_size=32, batch_size=4, num_workers=0)
        >>> dm.setup("fit")
        >>> images, labels = next(iter(dm.train_dataloader()))
        >>> images.dtype, tuple(images.shape), labels.dtype
        (torch.float32, (4, 3, 32, 32), torch.int64)
    """

    def __init__(
        self,
        train_dir: str,
        val_dir: str | None = None,
        image_size: int = 224,
        val_resize: int | None = None,
        scale: tuple[float, float] = (0.08, 1.0),
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        max_cache_size: str = "100GB",
        max_pre_download: int = 2,
        seed: int = 42,
        check_source: bool = True,
        bad_samples: Literal["raise", "skip"] = "raise",
        stall_s: float = 20.0,
        normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = (IMAGENET_MEAN, IMAGENET_STD),
        **kwargs: Any,
    ) -> None:
        checks.check_str("train_dir", train_dir)
        checks.check_str("val_dir", val_dir, allow_none=True)
        checks.check_int("image_size", image_size, low=1)
        checks.check_int("val_resize", val_resize, low=1, allow_none=True)
        checks.check_pair("scale", scale, low=0.0, high=1.0)
        checks.check_dict("storage_options", storage_options)
        checks.check_str("cache_dir", cache_dir, allow_none=True)
        checks.check_str("max_cache_size", max_cache_size)
        checks.check_int("max_pre_download", max_pre_download, low=1)
        checks.check_int("seed", seed, low=0)
        checks.check_bool("check_source", check_source)
        checks.check_choice("bad_samples", bad_samples, ("raise", "skip"))
        checks.check_number("stall_s", stall_s, low=0.1, high=30.0)
        if kwargs.get("num_workers") == "auto":
            raise ValueError(
                "num_workers='auto' is not available for StreamingDataModule: litdata splits chunks across workers "
                "and its resume state depends on their count, so the count must stay what it was when the run "
                "started. Give an int, or None for the usable-CPU default."
            )
        super().__init__(normalize=normalize, **kwargs)
        self.train_dir, self.val_dir = train_dir, val_dir
        self.image_size, self.val_resize, self.scale = image_size, val_resize, tuple(scale)
        self.storage_options = dict(storage_options or {})
        self.cache_dir, self.max_cache_size, self.max_pre_download = cache_dir, max_cache_size, max_pre_download
        self.seed, self.check_source = seed, check_source
        self.bad_samples, self.stall_s = bad_samples, float(stall_s)
        #: url -> the checked :class:`~lightning_gpu_boost.core.streaming.StreamSource`
        self.sources: dict[str, Any] = {}

    def setup(self, stage: str | None = None) -> None:
        """Check each stream once (see the class's doc) before any loader is built."""
        if not self.check_source:
            return
        from lightning_gpu_boost.core.streaming import check_stream_source

        for url in filter(None, (self.train_dir, self.val_dir)):
            if url not in self.sources:
                source = self.sources[url] = check_stream_source(url, self.storage_options)
                rank_zero_info(f"{type(self).__name__}: {url}: {source.samples} samples in {len(source.chunks)} "
                               f"chunks ({source.chunk_bytes / 2**20:,.1f} MiB)")  # fmt: skip
                if not source.checksummed:
                    rank_zero_warn(f"{url}: its samples carry no checksum (written before write_image_stream "
                                   "stored one): damaged bytes would train unnoticed. Write the stream again.")  # fmt: skip

    def _stream(self, url: str, train: bool) -> Any:
        from lightning_gpu_boost._imports import require
        from lightning_gpu_boost.core.streaming import DecodeImage
        from lightning_gpu_boost.core.streaming.source import litdata_storage_options

        require("litdata")
        from lightning_gpu_boost.core.streaming.checked import CheckedStream

        source = self.sources.get(url)
        return CheckedStream(
            url, chunks=source.chunks if source else None, chunk_samples=source.chunk_samples if source else None,
            bad_samples=self.bad_samples, stall_s=self.stall_s,
            cache_dir=self.cache_dir, shuffle=self.shuffle and train, drop_last=self.drop_last and train,
            seed=self.seed, max_cache_size=self.max_cache_size, max_pre_download=self.max_pre_download,
            storage_options=litdata_storage_options(url, self.storage_options, read_timeout_s=self.stall_s),
            transform=DecodeImage(self.image_size, train, self.val_resize, self.scale),
        )  # fmt: skip

    def train_dataset(self) -> Any:
        return self._stream(self.train_dir, train=True)

    def val_dataset(self) -> Any:
        return None if self.val_dir is None else self._stream(self.val_dir, train=False)

    def make_dataloader(self, dataset: Any, stage: Any) -> Any:
        """litdata's ``StreamingDataLoader`` over ``dataset`` with this DataModule's loader settings (its shuffle
        and split across workers and ranks are litdata's own), refusing a resume with other settings."""
        from lightning_gpu_boost.core.streaming.checked import CheckedStreamLoader

        kwargs = self.dataloader_kwargs(dataset, stage)
        kwargs.pop("shuffle", None)  # the dataset shuffles (and drops the last batch) itself
        kwargs.pop("drop_last", None)
        if kwargs.get("num_workers"):  # the plain-http settings reach workers that import litdata afresh too
            from lightning_gpu_boost.core.streaming.source import ReapplyInWorker

            url = self.train_dir if stage == "train" else self.val_dir
            kwargs["worker_init_fn"] = ReapplyInWorker(url, self.storage_options, kwargs.get("worker_init_fn"))
        skip = getattr(dataset, "bad_samples", None) == "skip"
        if skip:
            from lightning_gpu_boost.core.bad_samples import SkipBadCollate

            kwargs["collate_fn"] = SkipBadCollate(kwargs.get("collate_fn"))
        normalize = self._normalize_in_workers(kwargs, self.normalize, stage)
        loader = CheckedStreamLoader(dataset, **kwargs)
        if skip:
            from lightning_gpu_boost.core.bad_samples import BadSampleLog

            loader.bad_sample_log = BadSampleLog(dataset, stage, warn=rank_zero_warn)
        self._record_normalize(loader, normalize)  # StreamPrefetch normalizes on the GPU's side stream
        return loader
