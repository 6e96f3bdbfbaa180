"""``DALIDataModule``: decode and augment images with NVIDIA DALI (on the GPU) inside Lightning, with exact epochs."""

from __future__ import annotations

import functools
import os
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost._imports import require
from lightning_gpu_boost._logging import node_info
from lightning_gpu_boost.core.cpus import processes_per_node, usable_cpus
from lightning_gpu_boost.core.dali import DTYPES, DALILoader, Dtype, classification_graph, open_source
from lightning_gpu_boost.core.image_sources import check_image_source, check_same_classes
from lightning_gpu_boost.core.images import IMAGENET_MEAN, IMAGENET_STD

__all__ = ['CPU_DECODE_MIN_THREADS', 'DALIDataModule']

#: ``decoder_device="auto"`` decodes on the CPU from this many DALI threads per process (H100, ResNet-50: ~6 cores
#: decoded 3,960 img/s of ~71 KiB JPEGs)
CPU_DECODE_MIN_THREADS = 8


class DALIDataModule(pl.LightningDataModule):
    """Image classification with DALI: files or LMDB records are read on the CPU, decoded (by DALI's CPU threads,
    which decode only the random crop, or by nvJPEG and the hardware JPEG decoder on the GPU: ``decoder_device``),
    resized, flipped and normalized on the GPU, and handed to the step already on the GPU. On a CPU-only Trainer the
    same pipeline runs on the CPU (``device_id=None``).

    Batches are ``(images, labels)``: ``images`` of shape ``(N, 3, image_size, image_size)`` in ``dtype``
    (``channels_last`` memory format if asked), normalized with ``normalize``; ``labels`` ``int64`` of shape
    ``(N,)``; both on the Trainer's device.

    Lightning correctness: ``len()`` is the real batch count of this rank; under DDP every rank reads its own shard
    (``rank_indices``: ``ceil(N / world_size)`` samples each, padded like ``DistributedSampler``) so every rank
    runs the same number of steps; the last batch is short (``drop_last=False``) or dropped. Every epoch covers
    the shard exactly once even when Lightning stops an epoch early (``limit_train_batches``, ``max_steps``,
    sanity validation, an exception); batches are copied out of DALI's buffers, so a batch held ahead stays valid.
    A run resumed from a checkpoint continues the epoch exactly after the batches already handed out (the loader's
    place is saved in Lightning's loop state).

    Extension point: override :meth:`graph` to change decoding and augmentation (it gets the encoded-bytes DALI
    node and returns the image node), or :meth:`source` to read other files.

    Logged: one info line per pipeline with its device, decoder and CPU threads.

    Args:
        train_root: a class-per-folder tree or an LMDB image pack (file or shard manifest).
        val_root: the validation tree or pack, or ``None``.
        batch_size: samples per batch and rank.
        val_batch_size: validation batch size (default ``batch_size``).
        image_size: output height and width.
        val_resize: shorter side before the validation center crop (default ``image_size / 0.875``).
        scale: area range of the training random-resized crop.
        ratio: aspect-ratio range of the training random-resized crop.
        flip: random horizontal flip in training.
        normalize: ``(mean, std)`` on the 0-1 scale, or ``None`` to keep 0-255 values.
        dtype: ``"float32"``, ``"float16"``, ``"bfloat16"`` or ``"uint8"`` (with ``normalize=None``).
        channels_last: batches in ``channels_last`` memory format (DALI writes ``HWC``).
        device: ``"auto"`` (the Trainer's device: GPU pipeline on CUDA, CPU pipeline otherwise) or ``"cpu"``.
        decoder_device: where a GPU pipeline decodes: ``"cpu"`` (DALI's CPU threads decode the crop;
            resizing and normalizing stay on the GPU), ``"mixed"`` (nvJPEG on the GPU) or ``"auto"``: ``"cpu"`` when
            DALI gets at least 8 CPU threads in this process, else ``"mixed"``. On the H100 machine (16 cores,
            ResNet-50) CPU decoding kept 98.2-98.9 % of the ceiling with ~6 cores beyond the training loop, GPU
            decoding 89-94 % with ~2: the GPU decoder's many small kernels wait behind the training kernels
            (``docs/dali.md``).
        hw_decoder_load: share of images sent to the hardware JPEG decoder (A100, H100) with GPU decoding; in
            H100 runs 0.99 kept 87-94 % of the ceiling with ~2 CPU cores busy, DALI's default 0.65 82-92 % with ~4.
        decoder_options: more arguments of the DALI decoder (e.g. ``{"use_fast_idct": True}``).
        pipeline_options: more ``nvidia.dali.Pipeline`` arguments (e.g. ``{"exec_dynamic": False}``).
        bad_samples: a file or record that cannot be read or is not a whole image: ``"raise"`` an error naming it, or
            ``"skip"``: Python reads and checks every file (structure, as ``pack`` does; folders are then not read by
            DALI's threads) and drops broken ones; the next samples take their places (batches stay full), counted per epoch (logged as
            ``bad_samples/train``, ``bad_samples/val``) and named in one warning per epoch. Damage inside the
            compressed data that the structure check cannot see still stops DALI's decoder: ``lightning-gpu-boost
            pack --check decode`` finds it ahead.
        num_threads: DALI CPU threads per process (default: this process's share of the usable CPUs, minus one).
        read_threads: threads reading encoded files or records ahead.
        prefetch_queue_depth: batches DALI prepares ahead.
        shuffle: shuffle the training set every epoch (seeded by ``seed + epoch``).
        order: the training order of a pack: ``"random"`` (a full shuffle) or ``"block"`` (runs of consecutive
            records read together in one background read each, blocks shuffled each epoch, records shuffled within
            a window of blocks, DDP shards by block; as ``LMDBDataModule(order="block")``): for packs bigger than
            the page cache or on network storage. Packs only.
        block_bytes: bytes per block with ``order="block"`` (records per block from the pack's mean record size).
        window_blocks: blocks shuffled together with ``order="block"``.
        seed: seed of the shuffle and of DALI's random augmentation (plus the rank).
        drop_last: drop the short last training batch.
        check_crc: verify LMDB records as they are read.
        pipelines: DALI pipelines decoding alternate batches side by side (each with its share of the CPU
            threads); default: 2 for GPU pipelines, 1 for CPU pipelines. While the GPU trains, each pipeline's
            GPU work waits behind the training kernels, so one pipeline delivers far fewer batches than it does
            alone (H100: 22,809 img/s alone, 2,459 with the GPU busy); side by side they overlap those waits
            (2: 3,661, 3: 4,634 with the GPU busy). See ``docs/dali.md``.

    Raises:
        ValueError: a bad argument.
        FileNotFoundError: a root that does not exist.
        ImportError: DALI is not installed (names the extra: ``dali``, or ``dali-cuda13`` for CUDA 13 torch).

    Example::

        >>> import tempfile
        >>> from lightning_gpu_boost.core.images import make_jpeg_folder
        >>> root = make_jpeg_folder(tempfile.mkdtemp(), n=10, num_classes=2, size_range=(64, 80, 48, 64), progress=False)
        >>> dm = DALIDataModule(str(root), image_size=32, batch_size=4, device="cpu")
        >>> loader = dm.train_dataloader()
        >>> len(loader), [tuple(images.shape) for images, labels in loader]
        (3, [(4, 3, 32, 32), (4, 3, 32, 32), (2, 3, 32, 32)])
    """

    def __init__(
        self,
        train_root: str,
        val_root: str | None = None,
        batch_size: int = 256,
        val_batch_size: int | None = None,
        image_size: int = 224,
        val_resize: int | None = None,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = True,
        normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = (IMAGENET_MEAN, IMAGENET_STD),
        dtype: Dtype = "float32",
        channels_last: bool = False,
        device: Literal["auto", "cpu"] = "auto",
        hw_decoder_load: float = 0.99,
        num_threads: int | None = None,
        read_threads: int = 4,
        prefetch_queue_depth: int = 2,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        check_crc: bool = True,
        pipelines: int | None = None,
        decoder_options: dict[str, Any] | None = None,
        pipeline_options: dict[str, Any] | None = None,
        decoder_device: Literal["auto", "mixed", "cpu"] = "auto",
        bad_samples: Literal["raise", "skip"] = "raise",
        order: Literal["random", "block"] = "random",
        block_bytes: int = 4 << 20,
        window_blocks: int = 16,
    ) -> None:
        super().__init__()
        checks.check_choice("bad_samples", bad_samples, ("raise", "skip"))
        check_image_source("train_root", train_root)
        checks.check_choice("order", order, ("random", "block"))
        checks.check_int("block_bytes", block_bytes, low=1)
        checks.check_int("window_blocks", window_blocks, low=1)
        if order == "block" and os.path.isdir(train_root):
            raise ValueError(
                f"order='block' reads runs of consecutive records of an LMDB pack; {str(train_root)!r} is a folder. "
                "Pack it (`lightning-gpu-boost pack --shuffle-seed 0 SRC DST`) or keep order='random'."
            )
        check_image_source("val_root", val_root, allow_none=True)
        check_same_classes(train_root, val_root)
        checks.check_int("val_resize", val_resize, low=1, allow_none=True)
        checks.check_pair("scale", scale, low=0.0, high=1.0)
        checks.check_pair("ratio", ratio, low=0.0)
        checks.check_normalize("normalize", normalize)
        checks.check_number("hw_decoder_load", hw_decoder_load, low=0.0, high=1.0)
        checks.check_int("seed", seed, low=0)
        for name, value in (("flip", flip), ("channels_last", channels_last), ("shuffle", shuffle),
                            ("drop_last", drop_last), ("check_crc", check_crc)):  # fmt: skip
            checks.check_bool(name, value)
        checks.check_dict("decoder_options", decoder_options)
        checks.check_dict("pipeline_options", pipeline_options)
        for name, value in (("batch_size", batch_size), ("image_size", image_size),
                            ("read_threads", read_threads), ("prefetch_queue_depth", prefetch_queue_depth)):  # fmt: skip
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        for name, value in (("val_batch_size", val_batch_size), ("num_threads", num_threads),
                            ("pipelines", pipelines)):  # fmt: skip
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be None or an int >= 1, got {value!r}.")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}.")
        if dtype == "uint8" and normalize is not None:
            raise ValueError("dtype='uint8' keeps 0-255 pixels: pass normalize=None with it.")
        if device not in ("auto", "cpu"):
            raise ValueError(f"device must be 'auto' or 'cpu', got {device!r}.")
        if decoder_device not in ("auto", "mixed", "cpu"):
            raise ValueError(f"decoder_device must be 'auto', 'mixed' or 'cpu', got {decoder_device!r}.")
        self.train_root, self.val_root = str(train_root), None if val_root is None else str(val_root)
        self.batch_size, self.val_batch_size = batch_size, val_batch_size or batch_size
        self.image_size, self.val_resize, self.scale, self.ratio = (
            image_size,
            val_resize,
            tuple(scale),
            tuple(ratio),
        )
        self.flip, self.normalize, self.dtype, self.channels_last = flip, normalize, dtype, channels_last
        self.device, self.hw_decoder_load, self.num_threads = device, hw_decoder_load, num_threads
        self.read_threads, self.prefetch_queue_depth = read_threads, prefetch_queue_depth
        self.shuffle, self.seed, self.drop_last, self.check_crc = shuffle, seed, drop_last, check_crc
        self.pipelines, self.decoder_options = pipelines, dict(decoder_options or {})
        self.pipeline_options, self.decoder_device = dict(pipeline_options or {}), decoder_device
        self.bad_samples = bad_samples
        self.order, self.block_bytes, self.window_blocks = order, block_bytes, window_blocks
        #: where GPU pipelines decode (``"mixed"`` or ``"cpu"``), resolved from ``decoder_device`` when one is built
        self.decoder_in_use: Literal["mixed", "cpu"] = "mixed" if decoder_device == "mixed" else "cpu"
        self._loaders: dict[str, DALILoader] = {}
        self.classes: list[str] = []

    # -- extension points -------------------------------------------------------------------------------------
    def source(self, root: str) -> Any:
        """The sample source of ``root``: ``__len__`` and ``read(index) -> (encoded uint8 array, label)``."""
        return open_source(root, check_crc=self.check_crc)

    def graph(self, encoded: Any, train: bool, gpu: bool) -> Any:
        """DALI operators from the encoded-bytes node to the image node (see ``classification_graph``)."""
        return classification_graph(
            encoded, train=train, gpu=gpu, image_size=self.image_size, val_resize=self.val_resize,
            scale=self.scale, ratio=self.ratio, flip=self.flip, normalize=self.normalize, dtype=self.dtype,
            channels_last=self.channels_last, hw_decoder_load=self.hw_decoder_load,
            decoder_options=self.decoder_options, decoder_device=self.decoder_in_use,
        )  # fmt: skip

    # -- Lightning ----------------------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        if not self.classes:
            self.classes = list(self.source(self.train_root).classes)
        return len(self.classes)

    def _placement(self) -> tuple[int | None, int, int, int]:
        """``(device_id, rank, world_size, processes on this node)`` from the Trainer, or a lone process."""
        import torch

        trainer = self.trainer
        if trainer is not None:
            root = trainer.strategy.root_device
            gpu = root.type == "cuda" and self.device == "auto"
            device_id = (torch.cuda.current_device() if root.index is None else root.index) if gpu else None
            return device_id, trainer.global_rank, trainer.world_size, processes_per_node(trainer)
        gpu = self.device == "auto" and torch.cuda.is_available()
        return (torch.cuda.current_device() if gpu else None), 0, 1, processes_per_node()

    def _loader(self, stage: str) -> DALILoader:
        require("nvidia.dali")
        if stage in self._loaders:
            return self._loaders[stage]
        train = stage == "train"
        root = self.train_root if train else self.val_root
        assert root is not None
        source = self.source(root)
        if train:
            self.classes = list(source.classes)
        device_id, rank, world_size, procs = self._placement()
        threads = self.num_threads or max(1, usable_cpus() // procs - 1)
        if self.decoder_device == "auto":
            self.decoder_in_use = "cpu" if threads >= CPU_DECODE_MIN_THREADS else "mixed"
        loader = DALILoader(
            source,
            functools.partial(self.graph, train=train, gpu=device_id is not None),
            self.batch_size if train else self.val_batch_size,
            device_id=device_id,
            num_threads=threads,
            read_threads=self.read_threads,
            shuffle=self.shuffle and train,
            seed=self.seed,
            drop_last=self.drop_last and train,
            rank=rank,
            world_size=world_size,
            prefetch_queue_depth=self.prefetch_queue_depth,
            dtype=self.dtype,
            channels_last=self.channels_last,
            pipelines=self.pipelines or (1 if device_id is None else 2),
            pipeline_options=self.pipeline_options,
            bad_samples=self.bad_samples,
            order=self.order if train else "random",
            block_size=self._block_size(source) if train and self.order == "block" else 1,
            window_blocks=self.window_blocks,
        )
        if self.bad_samples == "skip":
            from lightning_gpu_boost.core.bad_samples import BadSampleLog

            loader.bad_sample_log = BadSampleLog(loader, "train" if train else "val", warn=rank_zero_warn)
        if device_id is None:
            where = "CPU (decode on the CPU)"
        elif self.decoder_in_use == "cpu":
            where = f"cuda:{device_id} (decode: DALI's CPU threads, resize and normalize on the GPU)"
        else:
            where = f"cuda:{device_id} (decode: mixed, hw_decoder_load={self.hw_decoder_load})"
        where += f", {loader.pipelines} pipeline(s)"
        node_info(
            self.trainer,
            f"DALIDataModule: {stage} pipeline on {where}, {threads} DALI CPU threads + {self.read_threads} "
            f"read threads per process ({procs} process(es) per node, {usable_cpus()} usable CPUs); "
            f"{len(source)} samples, {len(loader)} batches per rank and epoch."
        )
        self._loaders[stage] = loader
        return loader

    def _block_size(self, source: Any) -> int:
        """Records per block for ``order="block"``: about ``block_bytes`` at the pack's mean record size."""
        from lightning_gpu_boost.core.block_shuffle import block_size_for
        from lightning_gpu_boost.datamodules.lmdb import _pack_bytes

        return block_size_for(len(source), _pack_bytes(self.train_root, len(source)), self.block_bytes)

    def train_dataloader(self) -> DALILoader:
        return self._loader("train")

    def val_dataloader(self) -> DALILoader | list:
        return [] if self.val_root is None else self._loader("val")

    def teardown(self, stage: str) -> None:
        """Stop the pipelines' threads and free them; the next stage builds new loaders."""
        loaders, self._loaders = list(self._loaders.values()), {}
        for loader in loaders:
            loader.close()

    def on_exception(self, exception: BaseException) -> None:
        """A fit that ends with an exception (a bad sample, Ctrl-C) stops the pipelines' threads too (Lightning
        calls no ``teardown`` then)."""
        self.teardown("fit")
        self._loaders.clear()
