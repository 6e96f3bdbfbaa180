"""``StreamPrefetch``: the Lightning adapter of :class:`~lightning_gpu_boost.core.prefetch.StreamPrefetcher`."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost._lightning import batches_done_in_epoch
from lightning_gpu_boost.callbacks._data_path import add_stage, data_path, facts_of, remove_stage
from lightning_gpu_boost.callbacks._gpu_decode import DecodeMode, GPUDecodeStage
from lightning_gpu_boost.core.handover import BackwardWindow
from lightning_gpu_boost.core.loaders import iter_loaders
from lightning_gpu_boost.core.move_normalize import move_normalize, restore_normalize
from lightning_gpu_boost.core.prefetch import MAX_DEPTH, GPUNormalize, StreamPrefetcher, as_normalize
from lightning_gpu_boost.core.train_stream import TrainStream

__all__ = ['StreamPrefetch']

_USER_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device")


class StreamPrefetch(Callback):
    """Copy batch N+1 to the GPU on a side CUDA stream while batch N computes, for every loader and strategy.

    Lightning copies each batch on the compute stream right before the step, so copy and compute never overlap.
    This callback wraps the train, val, test and predict loaders in a
    :class:`~lightning_gpu_boost.core.prefetch.StreamPrefetcher` through the strategy's public
    ``process_dataloader`` hook (after Lightning injected its ``DistributedSampler``), so the copy of the next
    batch hides behind the current step. Optionally it normalizes uint8 images on the GPU (ship 4x fewer bytes
    than float32).

    Measured on an H100 with a transfer-bound step (float32 256x3x224x224 pinned batches into a light model,
    bf16): see ``docs/stream_prefetch.md`` for the numbers of the committed benchmark run.

    Logged metrics:
        None. (``GPUUtilWatchdog`` shows the data wait it removes.)

    Args:
        normalize: ``(mean, std)`` per channel in [0, 1] units applied on the GPU to uint8 image tensors
            ``(N, C, H, W)`` (without CUDA, on the CPU: the step gets the same values); ``None`` leaves batches
            unchanged, but for loaders of the package's DataModules, which say their own ``normalize``.
        image_key: which tensor to normalize: a dict key or a tuple position; ``None`` normalizes every
            4-dimensional uint8 tensor of the batch.
        normalize_dtype: dtype of normalized images (``dtype`` before; the old name still works, with a
            deprecation warning).
        channels_last: return normalized images in ``channels_last`` memory format (faster convolutions).
        depth: batches copied ahead, in ``[1, 16]``.
        cpu_lookahead: without CUDA, still wrap the loaders and look ahead (no copy), e.g. to test that a
            pipeline behaves the same with the wrapper; by default the callback does nothing without CUDA but
            normalize (``normalize``) and transform (``transform``), so that the step gets what a GPU run gets.
        move_normalize: where a loader's dataset is a torchvision dataset whose ``transform`` ends in
            ``ToTensor(), Normalize(mean, std)`` (or the v2 ``ToImage(), ToDtype(torch.float32, scale=True),
            Normalize(...)``), drop those two from the workers' transform and do them on the GPU instead: the
            workers send uint8 images (less CPU per image, 4x fewer bytes to collate, pin and copy) and the
            model receives the same normalized float32 images (one info line per loader). Ignored when
            ``normalize`` is given. ``GPUBoost`` turns it on.
        transform: a batch transform run on the GPU for the training loader (e.g. a
            ``torchvision.transforms.v2.Compose`` or ``kornia.augmentation.AugmentationSequential`` on CUDA
            tensors), right after the side-stream copy, ``depth`` batches ahead, so it overlaps the current step.
            Its random draws are seeded per rank, epoch and batch (reproducible, the same whatever ``depth``; see
            :class:`~lightning_gpu_boost.core.prefetch.StreamPrefetcher`). It runs before ``normalize``. Loaders
            whose batches are already on the GPU (``DALILoader``) are wrapped only to run it.
        val_transform: the (deterministic) batch transform for validation, test and predict loaders.
        transform_seed: the seed of ``transform``'s draws; ``None`` takes Lightning's ``seed_everything`` seed
            (``PL_GLOBAL_SEED``) where set, else 0.
        decode: where the JPEGs of a recognized torchvision pipeline (an ``ImageFolder``/``DatasetFolder`` with
            the default loader and a ``Compose`` of ``RandomResizedCrop``, ``RandomHorizontalFlip``, ``Resize``,
            ``CenterCrop``, then ``ToTensor`` and ``Normalize``) are decoded on CUDA: ``"cpu"`` (the workers, as
            written), ``"gpu"`` (the workers send the file's bytes and each sample's drawn parameters; the GPU's
            JPEG engines or nvJPEG decode, and the crop, resize, flip and normalize run on the GPU, one batch
            ahead), or ``"auto"`` (training is timed with the CPU decode, the GPU decode and a split of each batch; the fastest is kept,
            the CPU decode unless another is more than 3 % faster). ``GPUBoost`` says ``"auto"``. With DALI the
            training batches' hand-over thread starts each batch's work while the training thread is in backward
            (:class:`~lightning_gpu_boost.core.handover.BackwardWindow`), and training runs on a CUDA stream of
            its own (:class:`~lightning_gpu_boost.core.train_stream.TrainStream`). See ``docs/gpu_decode.md``.

    Raises:
        ValueError: bad ``normalize``, ``normalize_dtype``, ``depth``, ``transform_seed`` or ``decode``, or a
            ``transform`` that is not callable.

    On CUDA, DataLoaders with workers and ``pin_memory=False`` are switched to ``pin_memory=True`` (one info line): an
    asynchronous copy needs page-locked memory, and the DataLoader pins in its own thread.

    Caveats:
        If your LightningModule or DataModule overrides ``on_before_batch_transfer`` or
        ``transfer_batch_to_device``, those hooks expect CPU batches: the callback then warns once and leaves
        the loaders alone. ``on_after_batch_transfer`` keeps working (it receives GPU batches, as always).

    Example::

        >>> from lightning.pytorch import Trainer
        >>> from lightning_gpu_boost.callbacks import StreamPrefetch
        >>> trainer = Trainer(callbacks=[StreamPrefetch(normalize=((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))],
        ...                   logger=False, enable_checkpointing=False, enable_progress_bar=False)
    """

    #: the training loader's GPU decode (DALI's hand-over thread) starts each batch's work while the training thread
    #: is in backward (:class:`~lightning_gpu_boost.core.handover.BackwardWindow`); False: whenever a batch is
    #: taken (``benchmarks/gpu_decode.py``'s ``copy_3_no_backward_window`` variant)
    _backward_window = True
    #: with the training loader's GPU decode, training runs on a CUDA stream of its own of this priority
    #: (:class:`~lightning_gpu_boost.core.train_stream.TrainStream`); None: on the thread's stream as it is
    #: (``benchmarks/gpu_decode.py``'s ``copy_3_default_stream`` variant)
    _train_stream_priority: int | None = 0

    def __init__(
        self,
        normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
        image_key: str | int | None = None,
        normalize_dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        channels_last: bool = False,
        depth: int = 1,
        cpu_lookahead: bool = False,
        move_normalize: bool = False,
        transform: Callable[[Any], Any] | None = None,
        val_transform: Callable[[Any], Any] | None = None,
        transform_seed: int | None = None,
        decode: DecodeMode = "cpu",
    ) -> None:
        checks.check_int("depth", depth, low=1, high=MAX_DEPTH)
        checks.check_choice("decode", decode, ("auto", "cpu", "gpu"))
        self.decode = decode
        #: the GPU decode of the fit in progress (``decode`` "gpu" or "auto" on CUDA), else None
        self.gpu_decode: GPUDecodeStage | None = None
        #: where the last fit decoded (``{"share", "why", "rates", "windows", "engine_load", "gpu_decoder",
        #: "backward_window", "train_stream"}``: the hand-over thread's waits, the training stream), kept after it ends
        self.decode_placement: dict[str, Any] | None = None
        checks.check_int("transform_seed", transform_seed, low=0, allow_none=True)
        for name, value in (("transform", transform), ("val_transform", val_transform)):
            if value is not None and not callable(value):
                raise ValueError(f"{name} must be a callable on the batch (on the GPU) or None, got {value!r}.")
        self.transform, self.val_transform, self.transform_seed = transform, val_transform, transform_seed
        self._train_prefetchers: weakref.WeakSet[StreamPrefetcher] = weakref.WeakSet()
        checks.check_choice("normalize_dtype", normalize_dtype, ("float32", "bfloat16", "float16"))
        checks.check_normalize("normalize", normalize)
        if image_key is not None and (isinstance(image_key, bool) or not isinstance(image_key, (str, int))):
            raise TypeError(f"image_key must be a str, an int or None, got {image_key!r}.")
        for name, value in (("channels_last", channels_last), ("cpu_lookahead", cpu_lookahead),
                            ("move_normalize", move_normalize)):  # fmt: skip
            checks.check_bool(name, value)
        self.normalize = None
        if normalize is not None:
            mean, std = as_normalize(normalize)
            self.normalize = GPUNormalize(mean, std, dtype=normalize_dtype, channels_last=channels_last, key=image_key)
        self.depth = depth
        self.normalize_dtype = normalize_dtype
        self.cpu_lookahead = cpu_lookahead
        self.move_normalize = move_normalize
        self.channels_last = channels_last
        self._moved: weakref.WeakKeyDictionary[DataLoader, GPUNormalize] = weakref.WeakKeyDictionary()
        #: the stages whose dataset's ToTensor + Normalize were moved to the GPU (``move_normalize``)
        self.moved_normalize: list[str] = []
        self._trainer: Any = None
        self.active = False
        #: the window the training loader's hand-over thread works in, this fit (None: none)
        self.backward_window: BackwardWindow | None = None
        #: the training thread's stream beside the training loader's GPU decode, this fit (None: none)
        self.train_stream: TrainStream | None = None

    def _user_transfer_hooks(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[str]:
        found = [f"LightningModule.{h}" for h in _USER_TRANSFER_HOOKS if is_overridden(h, pl_module)]
        datamodule = trainer.datamodule
        if datamodule is not None:
            found += [
                f"LightningDataModule.{h}" for h in _USER_TRANSFER_HOOKS if is_overridden(h, datamodule)
            ]
        return found

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._trainer is not None:
            return
        device = trainer.strategy.root_device
        transforms = self.transform is not None or self.val_transform is not None
        if device.type != "cuda" and not self.cpu_lookahead and not transforms:
            if self.normalize is None:
                rank_zero_info("StreamPrefetch: no CUDA device in use, batches are loaded as usual (no-op).")
                return
            rank_zero_info("StreamPrefetch: no CUDA device in use; uint8 images are normalized on the CPU, one batch "
                           "ahead, so the step gets the values a GPU run gets.")  # fmt: skip
        if device.type != "cuda" and transforms:  # never train on batches that skipped the user's transform
            rank_zero_info("StreamPrefetch: no CUDA device in use; the batch transforms run on the CPU, one batch "
                           "ahead.")  # fmt: skip
        overridden = self._user_transfer_hooks(trainer, pl_module)
        if overridden:
            rank_zero_warn(
                f"StreamPrefetch is off: {', '.join(overridden)} is overridden and expects CPU batches. Move that "
                "work into `on_after_batch_transfer` (it runs on the GPU batch) to turn prefetching on."
            )
            return
        def layout() -> bool:  # images normalized on the GPU come out in the model's layout (GPUBoost's channels_last)
            return self.channels_last or _channels_last(pl_module)

        def to_uint8(dataloader: object, stage: str | None) -> object:
            # the path's first stage: AutoNumWorkers' probe (the next) measures the workers as they now compute
            if isinstance(dataloader, DataLoader) and dataloader not in self._moved:
                stats = move_normalize(dataloader.dataset)
                if stats is not None:
                    self._moved[dataloader] = GPUNormalize(*stats, channels_last=layout(), key=0)
                    self.moved_normalize.append(stage or "?")
                    rank_zero_info(f"StreamPrefetch: the {stage or ''} dataset's ToTensor + Normalize(mean="
                                   f"{stats[0]}, std={stats[1]}) now run on the GPU; workers send uint8 images.")  # fmt: skip
            return dataloader

        def wrap(dataloader: object, stage: str | None) -> object:
            transform = self.transform if stage in ("train", "fit", None) else self.val_transform
            if isinstance(dataloader, StreamPrefetcher):
                return dataloader  # already wrapped
            if isinstance(dataloader, (list, tuple, dict)) and not dataloader:
                return dataloader  # no loader (a DataModule's `[]` for a stage it has no data for)
            if getattr(dataloader, "batches_on_device", False) and transform is None:
                return dataloader  # a loader that yields GPU batches (DALILoader): nothing to copy or transform
            # the DataLoader itself, or the one a SpanningLoader (SpanEpochs) builds its workers' loader from
            source = next(iter_loaders(dataloader), None)
            if device.type == "cuda" and isinstance(source, DataLoader) and not source.pin_memory and source.num_workers:
                # pinning in the DataLoader's own thread is cheaper than pinning each batch in the training loop;
                # a loader without workers pins in the training loop either way, and may yield GPU tensors (which
                # its pinning would refuse): the prefetcher pins its CPU tensors then
                source.pin_memory = True
                rank_zero_info(f"StreamPrefetch: set pin_memory=True on the {stage or ''} loader.")
            normalize = self._moved.get(source, self.normalize) if isinstance(source, DataLoader) else self.normalize
            facts = facts_of(trainer, source)  # a DataModule's loader says how its uint8 images normalize
            stats = facts.normalize if facts is not None else None
            if normalize is None and isinstance(stats, tuple) and len(stats) == 2:
                normalize = GPUNormalize(*stats, dtype=self.normalize_dtype, channels_last=layout())
            decoder = None
            if self.gpu_decode is not None:  # the workers send JPEGs: the decoder makes the normalized images
                decoder = self.gpu_decode.decoder(source, device, self.normalize_dtype, layout())
                normalize = None if decoder is not None else normalize
            seed = self.transform_seed
            if seed is None:
                seed = int(os.environ.get("PL_GLOBAL_SEED", 0) or 0)
            window = None
            if decoder is not None and stage in ("train", "fit", None):  # the training loader's GPU decode
                if self._backward_window:
                    window = self.backward_window = self.backward_window or BackwardWindow()
                if self._train_stream_priority is not None:
                    self.train_stream = self.train_stream or TrainStream(device, self._train_stream_priority)
            prefetcher = StreamPrefetcher(dataloader, device=device, depth=self.depth, normalize=normalize,
                                          transform=transform, seed=seed, rank=trainer.global_rank,
                                          decode=decoder, window=window)  # fmt: skip
            if source is not None:  # what runs on the GPU after the copy, in order
                record = data_path(trainer).facts(source)
                record.on_gpu = [name for name, on in (("decode", decoder), ("transform", transform),
                                                       ("normalize", normalize)) if on]  # fmt: skip
            if transform is not None and stage in ("train", "fit", None):
                self._train_prefetchers.add(prefetcher)
                # a run resumed mid-epoch: a loader that saves its place (ours do) yields the epoch's next batch
                # first (Lightning calls no on_train_epoch_start then): the draws go on at that batch's index
                resumes = hasattr(dataloader, "state_dict") and hasattr(dataloader, "load_state_dict")
                prefetcher.set_epoch(trainer.current_epoch, batches_done_in_epoch(trainer) if resumes else 0)
            return prefetcher

        if self.decode != "cpu" and (device.type == "cuda" or self.cpu_lookahead):
            self.gpu_decode = GPUDecodeStage(self.decode)
            self.gpu_decode.attach(trainer)
        if self.move_normalize and self.normalize is None:
            add_stage(trainer, "worker_compute", f"StreamPrefetch-uint8-{id(self)}", to_uint8)
        add_stage(trainer, "copy", f"StreamPrefetch-{id(self)}", wrap)
        self._trainer = trainer
        self.active = True

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the epoch the loop goes on with is known now (a checkpoint saved at an epoch's last batch resumes with the
        # next epoch, and Lightning calls no on_train_epoch_start for it)
        if self.train_stream is not None:  # the training's kernels order only with what waits for them
            self.train_stream.enter()
        for prefetcher in list(self._train_prefetchers):
            resumes = callable(getattr(prefetcher, "state_dict", None))
            prefetcher.set_epoch(trainer.current_epoch, batches_done_in_epoch(trainer) if resumes else 0)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        if self.gpu_decode is not None:
            self.gpu_decode.on_train_batch_end(trainer)

    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self.backward_window is not None:
            self.backward_window.open()

    @override
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.backward_window is not None:
            self.backward_window.close()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.gpu_decode is not None:
            self.gpu_decode.restart_window()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.gpu_decode is not None:
            self.gpu_decode.restart_window()
        for prefetcher in list(self._train_prefetchers):  # the epoch seeds the transform's draws
            prefetcher.set_epoch(trainer.current_epoch)

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning calls no teardown after a failed or interrupted fit: the datasets taken over go back here
        self.teardown(trainer, pl_module, "fit")

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        owner, self._trainer = self._trainer, None
        self.active = False
        for loader in list(self._moved):
            restore_normalize(loader.dataset)
        self._moved.clear()
        stream, self.train_stream = self.train_stream, None
        if stream is not None:
            stream.exit()
        window, self.backward_window = self.backward_window, None
        if window is not None:
            window.finish()
        if self.gpu_decode is not None:
            decision = self.gpu_decode.decision
            self.decode_placement = {"share": self.gpu_decode.share, "why": self.gpu_decode.why,
                                     "rates": decision.rates if decision is not None else None,
                                     "windows": decision.windows if decision is not None else None,
                                     "engine_load": decision.engine_load if decision is not None else None,
                                     "gpu_decoder": self.gpu_decode.decoder_names(),
                                     "backward_window": window.figures() if window is not None else None,
                                     "train_stream": stream.figures() if stream is not None else None}  # fmt: skip
            self.gpu_decode.detach()
            self.gpu_decode = None
        if owner is not None:
            remove_stage(owner, f"StreamPrefetch-uint8-{id(self)}")
            remove_stage(owner, f"StreamPrefetch-{id(self)}")


def _channels_last(module: Any) -> bool:
    """Whether ``module``'s convolutions hold their weights in ``channels_last`` (``GPUBoost(channels_last=True)``
    converted it): the images normalized on the GPU then come out in that layout too."""
    for m in module.modules():
        if isinstance(m, torch.nn.Conv2d) and m.weight.dim() == 4:
            return m.weight.is_contiguous(memory_format=torch.channels_last) and not m.weight.is_contiguous()
    return False
