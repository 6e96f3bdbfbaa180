"""Image (and audio) batches decoded by NVIDIA DALI with exact epochs: a framework-free loader (no Trainer needed).

:class:`DALILoader` feeds a DALI pipeline through ``fn.external_source`` with a batch callable, so Python decides
which samples each epoch holds: every epoch covers this rank's shard exactly once, even after an epoch that was
stopped early (the few batches DALI computed ahead are discarded, the pipeline is reset, the next epoch starts at
its beginning). For folders Python sends file paths and DALI's threads read the files (``fn.io.file.read``); LMDB
records are read ahead by Python threads. Decoding, cropping, flipping and normalizing run in DALI (on the GPU
with ``device_id`` set, on the CPU with ``device_id=None``); :func:`audio_graph` decodes audio clips (a
:class:`FileListSource`) into padded waveforms with their lengths. Every batch is copied out of DALI's buffers
into its own torch tensor, so batches held ahead are never overwritten.

DALI is an optional dependency (extra ``dali`` for CUDA 12 torch builds, ``dali-cuda13`` for CUDA 13), imported
when a pipeline is built.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
import torch

from lightning_gpu_boost._imports import require
from lightning_gpu_boost.core.images import IMAGENET_MEAN, IMAGENET_STD, scan_image_folder

Dtype = Literal["float32", "float16", "bfloat16", "uint8"]
DTYPES = ("float32", "float16", "bfloat16", "uint8")


def rank_indices(
    n: int, epoch: int, rank: int = 0, world_size: int = 1, shuffle: bool = True, seed: int = 0
) -> list[int]:
    """The sample indices of one rank for one epoch, as torch's ``DistributedSampler`` picks them: one permutation
    seeded by ``seed + epoch`` (or the natural order), padded with its own first indices to a multiple of
    ``world_size``, then every ``world_size``-th index from ``rank``. Every rank gets ``ceil(n / world_size)``."""
    if n < 1:
        raise ValueError(f"A source needs at least one sample, got {n}.")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}.")
    if shuffle:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    else:
        order = list(range(n))
    per_rank = math.ceil(n / world_size)
    pad = per_rank * world_size - n
    order += (order * math.ceil(pad / n))[:pad]
    return order[rank::world_size]


def num_batches(n: int, batch_size: int, world_size: int = 1, drop_last: bool = False) -> int:
    """Batches per epoch of each rank (see :func:`rank_indices`)."""
    per_rank = math.ceil(n / world_size)
    return per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)


_CHECK_IMAGE = object()  # a source without ``check``: bad_samples.check_image (imported when a batch is read)


class _ListedFiles:
    """Files listed in ``samples`` (``(path, label)`` pairs), read as ``(uint8 array, label)`` or named to DALI."""

    samples: list[tuple[str, int]]
    #: what Python checks in the bytes it reads (``bad_samples="skip"``): images' structure, or the source's own
    #: callable (``None``: nothing)
    check: Any = _CHECK_IMAGE
    _encoded: list[np.ndarray] | None = None  # the paths as UTF-8 arrays, made on first use

    def __len__(self) -> int:
        return len(self.samples)

    def read(self, index: int) -> tuple[np.ndarray, int]:
        path, label = self.samples[index]
        return np.fromfile(path, dtype=np.uint8), label

    def sample_path(self, index: int) -> str:
        return self.samples[index][0]

    def path(self, index: int) -> tuple[np.ndarray, int]:
        """The file's path as UTF-8 bytes (for DALI's ``fn.io.file.read``) and its label."""
        if self._encoded is None:
            self._encoded = [np.frombuffer(p.encode("utf-8"), dtype=np.uint8) for p, _ in self.samples]
        return self._encoded[index], self.samples[index][1]


class FolderSource(_ListedFiles):
    """Encoded images of a class-per-folder tree (``root/<class>/<image>``), read as ``(uint8 array, label)``."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = str(root)
        self.samples, self.classes, self.ignored_files = scan_image_folder(root)


class FileListSource(_ListedFiles):
    """Files of any kind named in a list, each with its label (e.g. audio clips for :func:`audio_graph`), read by
    DALI's threads. Python checks nothing in them (``check = None``): a file DALI cannot decode stops its decoder.

    Args:
        paths: the files.
        labels: one ``int`` label per file.

    Raises:
        ValueError: no files, or not one label per file.
        FileNotFoundError: a file that does not exist.
    """

    check = None  # no structure check in Python for bytes read here (bad_samples="skip"): any file kind

    def __init__(self, paths: Sequence[str | os.PathLike], labels: Sequence[int]) -> None:
        self.samples = [(str(p), int(label)) for p, label in zip(paths, labels, strict=False)]
        if not self.samples or len(paths) != len(labels):
            raise ValueError(f"FileListSource needs one label per file and at least one file, got {len(paths)} "
                             f"paths and {len(labels)} labels.")  # fmt: skip
        missing = next((p for p, _ in self.samples if not os.path.isfile(p)), None)
        if missing is not None:
            raise FileNotFoundError(f"FileListSource: no file at {missing!r}.")
        self.root = os.path.commonpath([p for p, _ in self.samples]) if len(self.samples) > 1 else self.samples[0][0]
        self.classes = sorted({label for _, label in self.samples})


class PackSource:
    """Encoded images of an LMDB image pack (a pack file or a shard manifest), opened lazily in each process."""

    def __init__(self, path: str | os.PathLike, check_crc: bool = True) -> None:
        from lightning_gpu_boost.core.lmdb import open_pack

        self.root = str(path)
        self.reader = open_pack(path, check_crc=check_crc)
        if self.reader.meta("kind") != "image_folder":
            raise ValueError(
                f"{self.root!r} holds {self.reader.meta('kind')!r} samples, not an image folder pack."
            )
        self.classes = self.reader.meta("classes")
        self.ignored_files = self.reader.meta("ignored_files") or 0
        #: called with each index before its record is read (set by ``DALILoader(order="block")``)
        self.read_ahead: Callable[[int], None] | None = None

    def __len__(self) -> int:
        return len(self.reader)

    def read(self, index: int) -> tuple[np.ndarray, int]:
        if self.read_ahead is not None:
            self.read_ahead(index)
        return self.reader.read(index, lambda r: (np.frombuffer(bytes(r.payload), dtype=np.uint8), r.label))

    def sample_path(self, index: int) -> str:
        return self.reader.source_path(index)


def open_source(path: str | os.PathLike, check_crc: bool = True) -> FolderSource | PackSource:
    """A :class:`FolderSource` for a directory, a :class:`PackSource` for an LMDB pack file or shard manifest."""
    if os.path.isdir(path):
        return FolderSource(path)
    if os.path.exists(path) or os.path.exists(f"{path}.partial"):
        return PackSource(path, check_crc=check_crc)
    raise FileNotFoundError(
        f"No image folder or LMDB pack at {str(path)!r}: expected a class-per-folder tree or a file written by "
        "`lightning-gpu-boost pack`."
    )


class _Feeder:
    """The ``external_source`` batch callable: returns the encoded images and labels of the planned batches in
    order (read ahead by a thread pool) and raises ``StopIteration`` when the plan is used up."""

    def __init__(
        self, source: Any, read_threads: int, read_ahead: int, keep: int, paths: bool = False,
        bad_samples: str = "raise", tracker: Any = None,
    ) -> None:  # fmt: skip
        self.source = source
        self._get = source.path if paths else source.read  # paths: DALI's threads read the files
        self._paths = paths
        #: bytes read here are checked (the source's ``check``, default :func:`check_image`: structure) so that
        #: DALI never sees a broken file; a source with ``check = None`` is not checked
        self._check = None if paths else getattr(source, "check", _CHECK_IMAGE)
        self.bad_samples, self.tracker = bad_samples, tracker
        self.read_threads = read_threads
        self.read_ahead = read_ahead
        self._plan: deque[tuple[int, list[int]]] = deque()
        self._pending: deque[Future] = deque()
        self._pool: ThreadPoolExecutor | None = None
        self._keep: deque[Any] = deque(maxlen=keep)

    def _read_batch(self, epoch: int, indices: list[int]) -> tuple[list[np.ndarray] | np.ndarray, np.ndarray]:
        from lightning_gpu_boost.core.bad_samples import (
            BadSampleError,
            bad_sample_error,
            check_image,
            describe,
        )
        from lightning_gpu_boost.core.lmdb import CorruptRecordError

        items, bad = [], []
        check = check_image if self._check is _CHECK_IMAGE else self._check
        for i in indices:
            try:
                item = self._get(i)
                problem = check(memoryview(item[0])) if check is not None else None
            except (OSError, CorruptRecordError) as err:
                problem = str(err)
            if problem is None:
                items.append(item)
                continue
            if self.bad_samples == "raise":
                raise bad_sample_error(i, self.source.sample_path(i), self.source.root, problem)
            self.tracker.mark(i, epoch)  # dropped from this batch; DALILoader refills the batch
            bad.append(i)
        if not items:
            raise BadSampleError(
                f"Every sample of a batch is bad ({describe([self.source.sample_path(i) for i in bad[:5]], len(bad))});"
                " remove or repack the broken files."
            )
        labels = np.array([label for _, label in items], dtype=np.int64)
        if self._paths:
            # paths: one dense array, NUL-padded (DALI reads each row as a C string): DALI takes a dense batch in
            # one piece, where a list costs a conversion per sample in the feeding thread (H100 machine: 1.2 ms of
            # Python per 32-sample batch fed, beside a training thread that needs the same interpreter)
            dense = np.zeros((len(items), max(len(data) for data, _ in items) + 1), dtype=np.uint8)
            for k, (data, _) in enumerate(items):
                dense[k, : len(data)] = data
            return dense, labels
        return [data for data, _ in items], labels

    def _fill(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.read_threads, thread_name_prefix="dali-read")
        while self._plan and len(self._pending) < self.read_ahead:
            self._pending.append(self._pool.submit(self._read_batch, *self._plan.popleft()))

    def extend(self, batches: list[tuple[int, list[int]]]) -> None:
        """Plan ``batches`` (``(epoch, indices)``) after those already planned."""
        self._plan.extend(batches)
        self._fill()

    def planned(self) -> int:
        """Batches planned that DALI has not asked for yet."""
        return len(self._pending) + len(self._plan)

    def stop(self) -> None:
        """Forget the rest of the plan: the next call raises ``StopIteration``."""
        self._plan.clear()
        for future in self._pending:
            future.cancel()
        self._pending.clear()

    def __call__(self, batch_info: Any = None) -> tuple[list[np.ndarray], np.ndarray]:
        if not self._pending:
            raise StopIteration
        future = self._pending.popleft()
        self._fill()
        batch = future.result()
        self._keep.append(batch)  # DALI uses these arrays in place (no_copy): keep them alive until consumed
        return batch

    def close(self) -> None:
        self.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class _EpochBadSamples:
    """Bad samples a loader dropped, by the epoch their batch belongs to (DALI reads into the next epoch ahead of
    time); :class:`~lightning_gpu_boost.callbacks.bad_samples.BadSampleReport` reads it like a
    :class:`~lightning_gpu_boost.core.bad_samples.BadSampleTracker`: ``snapshot()`` at an epoch's start,
    ``since(snapshot)`` at its end."""

    def __init__(self, loader: DALILoader) -> None:
        self._loader = loader
        self.events: list[tuple[int, int]] = []  # (epoch, index); appended by reading threads

    def mark(self, index: int, epoch: int) -> None:
        self.events.append((epoch, index))

    def total(self) -> int:
        return len(self.events)

    def snapshot(self) -> int:
        return self._loader.epoch

    def since(self, epoch: int) -> tuple[int, list[int]]:
        indices = [i for e, i in list(self.events) if e == epoch]
        return len(indices), indices


class _EpochSetter:
    """Lightning calls ``dataloader.sampler.set_epoch(epoch)`` at every epoch start; this forwards it."""

    def __init__(self, loader: DALILoader) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)


def classification_graph(
    encoded: Any,
    *,
    train: bool,
    gpu: bool,
    image_size: int = 224,
    val_resize: int | None = None,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    flip: bool = True,
    normalize: tuple[Sequence[float], Sequence[float]] | None = (IMAGENET_MEAN, IMAGENET_STD),
    dtype: Dtype = "float32",
    channels_last: bool = False,
    hw_decoder_load: float = 0.65,
    decoder_options: dict[str, Any] | None = None,
    decoder_device: Literal["mixed", "cpu"] = "mixed",
) -> Any:
    """The image half of an ImageNet-style DALI pipeline. Training: decode with a random-resized crop (area
    ``scale``, aspect ``ratio``), resize to ``image_size``, random horizontal flip. Validation: decode, resize the
    shorter side to ``val_resize`` (default ``image_size / 0.875``), center crop. Both then normalize with
    ``(mean, std)`` on the 0-1 scale (``None``: keep 0-255) into ``dtype`` (``bfloat16`` leaves DALI as
    ``float16``; the loader converts it), layout ``CHW`` (``HWC`` with ``channels_last``). On the GPU
    (``gpu=True``) images are decoded by nvJPEG (``decoder_device="mixed"``, ``hw_decoder_load`` of them by the
    hardware decoder) or by DALI's CPU threads (``"cpu"``; the crop is decoded, then uploaded); resizing and
    normalizing run on the GPU either way. ``decoder_options`` go to the DALI decoder as they are."""
    dali = require("nvidia.dali")
    fn, types = dali.fn, dali.types
    if decoder_device not in ("mixed", "cpu"):
        raise ValueError(f"decoder_device must be 'mixed' or 'cpu', got {decoder_device!r}.")
    decode_device = "mixed" if gpu and decoder_device == "mixed" else "cpu"
    hw = {"hw_decoder_load": hw_decoder_load} if decode_device == "mixed" else {}
    hw.update(decoder_options or {})
    upload = gpu and decode_device == "cpu"  # CPU-decoded images go to the GPU for the rest
    if train:
        images = fn.decoders.image_random_crop(
            encoded, device=decode_device, output_type=types.RGB, random_area=list(scale),
            random_aspect_ratio=list(ratio), num_attempts=10, **hw,
        )  # fmt: skip
        resize = {"resize_x": image_size, "resize_y": image_size}
        mirror = fn.random.coin_flip(probability=0.5) if flip else 0
        crop = {}
    else:
        images = fn.decoders.image(encoded, device=decode_device, output_type=types.RGB, **hw)
        resize = {"resize_shorter": val_resize or round(image_size / 0.875)}
        mirror, crop = 0, {"crop": (image_size, image_size)}
    images = fn.resize(images.gpu() if upload else images, **resize)
    mean, std = normalize if normalize is not None else ((0.0,) * 3, (1 / 255,) * 3)
    out_type = {
        "float32": types.FLOAT,
        "float16": types.FLOAT16,
        "bfloat16": types.FLOAT16,
        "uint8": types.UINT8,
    }
    if dtype == "uint8" and normalize is not None:
        raise ValueError("dtype='uint8' keeps 0-255 pixels: pass normalize=None with it.")
    return fn.crop_mirror_normalize(
        images, dtype=out_type[dtype], output_layout="HWC" if channels_last else "CHW",
        mean=[255 * m for m in mean], std=[255 * s for s in std], mirror=mirror, **crop,
    )  # fmt: skip


def audio_graph(
    encoded: Any, *, gpu: bool, sample_rate: float | None = None, dtype: Literal["int16", "float32"] = "int16"
) -> tuple[Any, Any]:
    """Encoded audio files (WAV, FLAC, OGG: DALI's audio decoder, in its CPU threads) to ``(waveforms, lengths)``:
    each clip mono (channels averaged), at its own rate or resampled by DALI to ``sample_rate``, as ``int16`` PCM
    (half the bytes of float32) or ``float32`` in [-1, 1], zeros after each clip up to the batch's longest; on the
    GPU with ``gpu`` (padded there). A :class:`DALILoader` over it yields ``(waveforms N x T, lengths N, labels N)``,
    what :class:`~lightning_gpu_boost.core.gpu_transforms.LogMel` takes (e.g. as ``StreamPrefetch(transform=...)``).
    """
    dali = require("nvidia.dali")
    fn, types = dali.fn, dali.types
    if dtype not in ("int16", "float32"):
        raise ValueError(f"dtype must be 'int16' or 'float32', got {dtype!r}.")
    rate = {} if sample_rate is None else {"sample_rate": float(sample_rate)}
    audio, _ = fn.decoders.audio(encoded, dtype=types.INT16 if dtype == "int16" else types.FLOAT, downmix=True,
                                 **rate)  # fmt: skip
    lengths = fn.reshape(audio.shape(dtype=types.INT64), shape=[])
    if gpu:
        audio, lengths = audio.gpu(), lengths.gpu()
    return fn.pad(audio, fill_value=0), lengths


_LIVE: weakref.WeakSet[DALILoader] = weakref.WeakSet()


def close_all() -> None:
    """Close every DALILoader of this process (their threads and pipelines), e.g. before forking workers."""
    for loader in list(_LIVE):
        loader.close()


class _Producer(threading.Thread):
    """Runs ``count`` pipeline iterations of one epoch and queues their copied outputs (at most two ahead)."""

    def __init__(self, loader: DALILoader, count: int) -> None:
        super().__init__(name="dali-producer", daemon=True)
        self.loader, self.count = loader, count
        self.queue: queue.Queue = queue.Queue(maxsize=2)
        self.stop = threading.Event()

    def _put(self, item: Any) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(queue.Full):
                self.queue.put(item, timeout=0.05)
                return

    def run(self) -> None:
        try:
            pipes = self.loader._pipes
            for j in range(self.count):
                if self.stop.is_set():
                    return
                item = self.loader._take(pipes[j % len(pipes)])  # batch j of the epoch went to pipeline j % P
                self.loader._pos += 1
                self._put(item)
        except BaseException as err:  # handed to the training loop, which raises it
            self._put(self.loader._name_bad_files(err))


class DALILoader:
    """An iterable of ``(images, labels)`` batches from a DALI pipeline, with a real ``len()`` and exact epochs
    (``(*outputs, labels)`` for a graph with several outputs, e.g. :func:`audio_graph`).

    Each epoch takes this rank's indices from :func:`rank_indices` (shuffled by ``seed + epoch``; under DDP every
    rank gets ``ceil(n / world_size)`` samples, padded like ``DistributedSampler``, so all ranks run the same number
    of steps), in batches of ``batch_size``; the last batch is short unless ``drop_last``. ``set_epoch`` (Lightning
    calls it through ``loader.sampler``) picks the epoch; without it each new iteration advances the epoch.

    ``images`` is a tensor on ``cuda:<device_id>`` (``device_id=None``: on the CPU) of shape ``(N, 3, H, W)`` in
    ``dtype`` (``channels_last`` memory format if the graph returns ``HWC``); ``labels`` is ``int64`` of shape
    ``(N,)`` on the same device.

    Args:
        source: an object with ``__len__`` and ``read(index) -> (encoded uint8 array, label)``
            (:class:`PackSource`), or ``path(index) -> (UTF-8 path as a uint8 array, label)`` for files that DALI
            reads itself (:class:`FolderSource` has both and is read through ``path``).
        graph: ``graph(encoded) -> images`` builds the DALI operators that turn encoded bytes into images
            (e.g. :func:`classification_graph` with ``functools.partial``), or into a tuple of outputs, each dense
            per batch (e.g. :func:`audio_graph`: padded waveforms and their lengths).
        batch_size: samples per batch.
        device_id: CUDA device of the pipeline, ``None`` for a CPU-only pipeline.
        num_threads: DALI CPU threads.
        read_threads: threads reading encoded samples ahead.
        shuffle, seed, drop_last, rank, world_size: see above.
        order: with ``shuffle``, ``"random"`` (above) or ``"block"``: the block-shuffled order of
            :func:`~lightning_gpu_boost.core.block_shuffle.block_order` (blocks of ``block_size`` consecutive
            records shuffled each epoch, each rank a contiguous run of them, records shuffled within
            ``window_blocks`` blocks; the same samples per rank as ``"random"``), and a pack source reads each
            block in one background read when its first record is reached
            (:class:`~lightning_gpu_boost.core.block_shuffle.BlockReadAhead`).
        block_size, window_blocks: see ``order``.
        prefetch_queue_depth: batches DALI computes ahead.
        dtype: the (first) output's dtype, converted in torch where DALI lacks it (``bfloat16``).
        channels_last: the graph returns ``HWC``; batches are ``NCHW`` views in ``channels_last`` memory format.
        pipelines: DALI pipelines that decode alternate batches side by side (batch ``j`` of an epoch goes to
            pipeline ``j % pipelines``), each with ``num_threads // pipelines`` CPU threads.
        pipeline_options: more ``nvidia.dali.Pipeline`` arguments (e.g. ``exec_dynamic=False``).

    Raises:
        ValueError: a bad argument.
    """

    batches_on_device = True  # StreamPrefetch leaves these loaders alone
    batch_sampler = None  # Lightning looks for a sampler (``set_epoch``) and a batch sampler on every loader

    def __init__(
        self,
        source: Any,
        graph: Callable[[Any], Any],
        batch_size: int,
        device_id: int | None = None,
        num_threads: int = 4,
        read_threads: int = 4,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        prefetch_queue_depth: int = 2,
        dtype: Dtype = "float32",
        channels_last: bool = False,
        pipelines: int = 1,
        pipeline_options: dict[str, Any] | None = None,
        bad_samples: Literal["raise", "skip"] = "raise",
        order: Literal["random", "block"] = "random",
        block_size: int = 1,
        window_blocks: int = 16,
    ) -> None:
        from lightning_gpu_boost import _checks as checks
        from lightning_gpu_boost.core.bad_samples import POLICIES

        checks.check_choice("bad_samples", bad_samples, POLICIES)
        checks.check_choice("order", order, ("random", "block"))
        checks.check_int("block_size", block_size, low=1)
        checks.check_int("window_blocks", window_blocks, low=1)
        for name, value in (("batch_size", batch_size), ("num_threads", num_threads),
                            ("read_threads", read_threads), ("prefetch_queue_depth", prefetch_queue_depth),
                            ("world_size", world_size), ("pipelines", pipelines)):  # fmt: skip
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}.")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}.")
        self.source, self.graph, self.batch_size = source, graph, batch_size
        self.device_id, self.num_threads, self.read_threads = device_id, num_threads, read_threads
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.rank, self.world_size = rank, world_size
        self.order, self.block_size, self.window_blocks = order, block_size, window_blocks
        if order == "block" and callable(getattr(getattr(source, "reader", None), "will_need", None)):
            from lightning_gpu_boost.core.block_shuffle import BlockReadAhead

            # a pack source: each block is asked for in one read when the feeder reaches its first record
            source.read_ahead = BlockReadAhead(source.reader, block_size, len(source))
        self.prefetch_queue_depth, self.dtype, self.channels_last = prefetch_queue_depth, dtype, channels_last
        self.device = torch.device("cpu") if device_id is None else torch.device("cuda", device_id)
        self.sampler = _EpochSetter(self)
        self.epoch = 0
        self._epoch_set = False
        self._started = False
        self._stream: deque[tuple[int, int]] = deque()  # epochs planned into the pipeline: (epoch, batches)
        self._pos = 0  # batches of the first planned epoch already handed out
        self.pipelines, self.pipeline_options = pipelines, dict(pipeline_options or {})
        self._pipes: list[Any] = []
        self._producer: _Producer | None = None
        self._copy_stream: Any = None
        self._threaded = True  # False: no producer thread (diagnosis, benchmarks/diagnostics/dali_loop.py)
        self._primed: set[int] = set()  # pipelines whose first schedule_run (DALI's prefetch) happened
        self._alive: deque[tuple[Any, Any]] = deque()  # (copy event, DALI outputs) until the copy is done
        #: files are read by DALI's CPU threads (``fn.io.file.read``) when the source can name them, unless bad
        #: samples are skipped: then Python reads and checks every file, and drops the broken ones from the batch
        self.reads_in_dali = callable(getattr(source, "path", None)) and bad_samples == "raise"
        self.bad_samples = bad_samples
        #: bad samples dropped (``bad_samples="skip"``), per index; with ``sample_path`` for BadSampleReport
        self.bad_sample_tracker = _EpochBadSamples(self)
        self._feeders = [
            _Feeder(
                source,
                read_threads,
                read_ahead=max(2, prefetch_queue_depth + 1),
                keep=prefetch_queue_depth + 3,
                paths=self.reads_in_dali,
                bad_samples=bad_samples,
                tracker=self.bad_sample_tracker,
            )
            for _ in range(pipelines)
        ]
        _LIVE.add(self)
        #: batches discarded because an epoch stopped early or another epoch came next (DALI computed them ahead)
        self.discarded = 0
        self._place: tuple[int | None, int] = (None, 0)  # (epoch, batches of it handed out)
        self._saved: dict[str, Any] | None = None  # a place to start the next iteration at (load_state_dict)
        self._refill: Any = None

    def __len__(self) -> int:
        return num_batches(len(self.source), self.batch_size, self.world_size, self.drop_last)

    def sample_path(self, index: int) -> str:
        return self.source.sample_path(index)

    def _name_bad_files(self, err: BaseException) -> BaseException:
        """An error of DALI's decoder on files its threads read (folders, ``bad_samples="raise"``) names no file:
        check the files of the batches in flight and name the bad ones."""
        if not self.reads_in_dali or not isinstance(err, RuntimeError):
            return err
        from lightning_gpu_boost.core.bad_samples import BadSampleError, check_file

        bad = []
        for feeder in self._feeders:
            for paths, _ in list(feeder._keep):
                for path in (bytes(p).rstrip(b"\0").decode("utf-8", "surrogateescape") for p in paths):
                    problem = check_file(path, "decode")
                    if problem is not None:
                        bad.append(f"'{path}' ({problem})")
        if not bad:
            return err
        named = BadSampleError(
            f"DALI could not decode a batch holding {'; '.join(bad[:5])}{' and more' if len(bad) > 5 else ''}. Fix or remove the files "
            "(`lightning-gpu-boost pack` leaves such files out and lists them), or pass bad_samples='skip'."
        )
        named.__cause__ = err
        return named

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._epoch_set = True

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The index batches of ``epoch`` on this rank."""
        if self.order == "block" and self.shuffle:
            from lightning_gpu_boost.core.block_shuffle import block_order

            indices = block_order(len(self.source), self.block_size, self.window_blocks, self.seed, epoch, self.rank,
                                  self.world_size)  # fmt: skip
        else:
            indices = rank_indices(len(self.source), epoch, self.rank, self.world_size, self.shuffle, self.seed)
        batches = [indices[i : i + self.batch_size] for i in range(0, len(indices), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def _build(self) -> list[Any]:
        if not self._pipes:
            self._pipes = [self._build_one(k, feeder) for k, feeder in enumerate(self._feeders)]
        return self._pipes

    def _build_one(self, k: int, feeder: _Feeder) -> Any:
        dali = require("nvidia.dali")
        pipe = dali.Pipeline(
            batch_size=self.batch_size,
            num_threads=max(1, self.num_threads // self.pipelines),
            device_id=self.device_id,
            seed=self.seed + 7919 * self.rank + 104729 * k,
            prefetch_queue_depth=self.prefetch_queue_depth,
            **self.pipeline_options,
        )
        with pipe:
            encoded, labels = dali.fn.external_source(
                source=feeder, num_outputs=2, batch=True, batch_info=True, no_copy=True,
                dtype=[dali.types.UINT8, dali.types.INT64],
            )  # fmt: skip
            if self.reads_in_dali:  # the feeder sent paths: DALI's threads read the files, not Python
                encoded = dali.fn.io.file.read(encoded, dont_use_mmap=True)
            nodes = self.graph(encoded)
            nodes = tuple(nodes) if isinstance(nodes, (tuple, list)) else (nodes,)
            # Labels go to the GPU inside the pipeline: a copy from pageable memory would synchronize the stream.
            pipe.set_outputs(*nodes, labels.gpu() if self.device_id is not None else labels)
        pipe.build()
        return pipe

    def _plan(self, epoch: int, skip: int = 0) -> None:
        batches = self.epoch_batches(epoch)[skip:]
        for k, feeder in enumerate(self._feeders):  # batch j to pipeline j % P: they decode side by side
            feeder.extend([(epoch, b) for b in batches[k :: self.pipelines]])
        self._stream.append((epoch, len(batches)))

    def _restart(self) -> None:
        """Discard what DALI computed ahead (an epoch stopped early, or an unexpected epoch), then reset."""
        for feeder, pipe in zip(self._feeders, self._pipes, strict=True):
            feeder.stop()
            if id(pipe) in self._primed:
                pipe.schedule_run()  # the stopped feeder raises StopIteration: DALI marks the end
                try:
                    while True:
                        pipe.share_outputs()
                        pipe.release_outputs()
                        self.discarded += 1
                except StopIteration:
                    pass
            self._primed.discard(id(pipe))
            pipe.reset()
        self._stream.clear()
        self._pos = 0

    def _stop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.stop.set()
            while producer.is_alive():  # it may be blocked on a full queue
                with contextlib.suppress(queue.Empty):
                    self.discarded += not isinstance(producer.queue.get(timeout=0.05), BaseException)
            producer.join()

    def __iter__(self):
        saved, self._saved = self._saved, None
        return self._iterate(saved)

    def _next_epoch(self) -> int:
        """The epoch this iteration hands out. It is decided at the first ``next()``, not at ``iter()``: Lightning
        calls ``iter()`` before ``set_epoch``, and once more during setup."""
        self._build()
        self._stop_producer()  # the thread of an epoch that was stopped early
        if self._started and not self._epoch_set:
            self.epoch += 1
        self._started, self._epoch_set = True, False
        return self.epoch

    def _iterate(self, saved: dict[str, Any] | None):
        from lightning_gpu_boost.core.resume import resume_start

        epoch = self._next_epoch()
        applies = resume_start(saved, epoch, len(self)) > 0
        if self.bad_samples != "skip":
            start = int(saved["batches"]) if applies else 0  # type: ignore[index]
            self._place = (epoch, start)
            for batch in self._run(epoch, start):
                self._place = (epoch, self._place[1] + 1)
                yield batch
            return
        # skipped samples leave batches short: re-form full ones from the samples that follow (on the device)
        import warnings

        from lightning_gpu_boost.core.bad_samples import Counted, Refill

        resume = saved.get("refill") if applies else None  # type: ignore[union-attr]
        start = int(resume["source"]) if resume else 0
        counted = (Counted(batch, len(batch[-1]), ["B"] * len(batch)) for batch in self._run(epoch, start))
        self._refill = refill = Refill(counted, self.batch_size, len(self), warn=warnings.warn, resume=resume)
        self._place = (epoch, int(resume["emitted"]) if resume else 0)
        for batch in refill:
            self._place = (epoch, self._place[1] + 1)
            yield batch

    def local_state_dict(self) -> dict[str, Any]:
        """This rank's place: ``{"epoch": e, "batches": k}`` (and where bad samples are skipped, the place in the
        re-formed batches)."""
        state: dict[str, Any] = {"epoch": self._place[0], "batches": self._place[1]}
        if self.bad_samples == "skip" and self._refill is not None:
            state["refill"] = self._refill.position()
        return state

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands (every rank's place where bad samples are skipped: they differ between ranks; a
        collective under DDP then, which Lightning calls on every rank as it saves). After
        :meth:`load_state_dict`, the next iteration of that epoch continues after the batches handed out."""
        from lightning_gpu_boost.core.resume import gather_ranks

        state = self.local_state_dict()
        return gather_ranks(state) if self.bad_samples == "skip" else state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from lightning_gpu_boost.core.resume import own_rank

        if state:
            self._saved = dict(own_rank(state))

    def _run(self, epoch: int, skip: int = 0):
        """The batches of ``epoch`` after its first ``skip`` (a resumed run)."""
        if self._stream and self._pos >= self._stream[0][1]:  # the last epoch ended without a final next()
            self._stream.popleft()
            self._pos = 0
        if skip or not (self._stream and self._stream[0][0] == epoch and self._pos == 0):
            if self._stream or self._pos:
                self._restart()
            self._plan(epoch, skip)
        if len(self._stream) == 1:
            # Plan the epoch Lightning asks for next, so that DALI reads and decodes across the epoch boundary
            # instead of draining and refilling; a different next epoch (or an early stop) discards it.
            self._plan(epoch + 1)
        length = self._stream[0][1]
        # DALI keeps prefetch_queue_depth iterations of each pipeline in flight, and a feeder that runs dry ends
        # DALI's epoch for good: keep that many batches planned beyond this epoch's (short epochs: several epochs).
        depth = self.prefetch_queue_depth
        for _ in range(depth):
            if all(feeder.planned() >= depth + len(range(k, length, self.pipelines))
                   for k, feeder in enumerate(self._feeders) if k < length):  # fmt: skip
                break
            self._plan(self._stream[-1][0] + 1)
        if not self._threaded:  # the training loop runs the pipeline and copies on its own stream
            for j in range(length):
                tensors, _ = self._take(self._pipes[j % len(self._pipes)], same_stream=True)
                self._pos += 1
                yield tensors
            self._stream.popleft()
            self._pos = 0
            return
        # A thread runs the pipeline and copies its outputs: the training loop only picks up finished batches.
        producer = self._producer = _Producer(self, length)
        producer.start()
        for _ in range(length):
            item = producer.queue.get()
            if isinstance(item, BaseException):
                raise item
            yield self._hand_over(item)
        producer.join()
        self._producer = None
        self._stream.popleft()
        self._pos = 0

    def _take(self, pipe: Any, same_stream: bool = False) -> tuple[tuple[torch.Tensor, ...], Any]:
        """The next batch of ``pipe``, copied into torch tensors. Outputs are taken as DALIGenericIterator takes
        them (``schedule_run`` / ``share_outputs`` / ``release_outputs``, which keeps ``prefetch_queue_depth``
        iterations in flight): on the H100 that kept 2-3 points more of the ceiling than ``pipe.run()`` in a plain
        training loop (``benchmarks/diagnostics/dali_loop.py``)."""
        if id(pipe) not in self._primed:
            pipe.schedule_run()  # the first call schedules prefetch_queue_depth iterations
            self._primed.add(id(pipe))
        outputs = pipe.share_outputs()  # waits until DALI finished the batch
        item = self._to_torch(outputs, same_stream)
        if item[1] is not None:
            self._alive.append((item[1], outputs))  # DALI's buffers stay referenced until the copy is done
        pipe.release_outputs()
        pipe.schedule_run()  # keep prefetch_queue_depth iterations in flight (_run keeps the feeders ahead)
        return item

    def _to_torch(self, outputs: Any, same_stream: bool = False) -> tuple[tuple[torch.Tensor, ...], Any]:
        """Copy DALI's outputs (it reuses its buffers) into new tensors, on a side stream on CUDA (on the current
        stream with ``same_stream``): the graph's outputs (``dtype`` and ``channels_last`` apply to the first),
        then the labels, flat."""
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        cuda = self.device.type == "cuda" and not same_stream  # copies on the side stream
        if cuda and self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        stream = None  # CPU: a plain copy
        if self.device.type == "cuda":
            stream = self._copy_stream if cuda else torch.cuda.current_stream(self.device)
        tensors = []
        with torch.cuda.stream(self._copy_stream) if cuda else contextlib.nullcontext():
            for k, output in enumerate(outputs):
                dense = output.as_tensor()
                out = torch.empty(dense.shape(), dtype=to_torch_type[dense.dtype], device=self.device)
                feed_ndarray(dense, out, cuda_stream=stream)
                if k == 0 and self.dtype == "bfloat16":
                    out = out.to(torch.bfloat16)
                if k == 0 and self.channels_last:
                    out = out.permute(0, 3, 1, 2)
                tensors.append(out)
            tensors[-1] = tensors[-1].reshape(-1)  # the labels
            event = None
            if cuda:
                event = torch.cuda.Event()
                event.record(self._copy_stream)
        return tuple(tensors), event

    def _hand_over(self, item: tuple[tuple[torch.Tensor, ...], Any]) -> tuple[torch.Tensor, ...]:
        tensors, event = item
        while self._alive and self._alive[0][0].query():
            self._alive.popleft()
        if event is not None:  # the training stream waits for the copy, and owns the memory from now on
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            for t in tensors:
                t.record_stream(stream)
        return tensors

    def close(self) -> None:
        """Stop the threads and free the pipeline (its GPU memory)."""
        self._stop_producer()
        while self._alive:  # copies out of DALI's buffers still running
            self._alive.popleft()[0].synchronize()
        for feeder in self._feeders:
            feeder.close()
        self._pipes, self._pos = [], 0
        self._stream.clear()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "A DALILoader holds a live DALI pipeline and cannot be pickled; build one per process."
        )
