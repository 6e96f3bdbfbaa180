"""``GPUBoost``: one callback that turns on every data-path feature and the backend settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost._lightning import finish_ended_epoch
from lightning_gpu_boost.callbacks.auto_num_workers import AutoNumWorkers
from lightning_gpu_boost.callbacks.bad_samples import BadSampleReport
from lightning_gpu_boost.callbacks.gpu_util_watchdog import GPUUtilWatchdog
from lightning_gpu_boost.callbacks.spanning import SpanEpochs
from lightning_gpu_boost.callbacks.stream_prefetch import StreamPrefetch
from lightning_gpu_boost.core.shapes import VARIABLE_SHAPES, ShapeWatch
from lightning_gpu_boost.strategies.presets import (
    backend_settings,
    configure_backends,
    recommended_precision,
    restore_backends,
)

__all__ = ['GPUBoost']

#: where the running GPUBoost keeps its parts' states in a checkpoint
CHECKPOINT_KEY = "lightning_gpu_boost"

_HOOKS = (
    "setup", "teardown", "on_fit_start", "on_train_start", "on_train_end", "on_train_epoch_start",
    "on_train_batch_start", "on_train_batch_end", "on_validation_start", "on_validation_end", "on_save_checkpoint",
    "on_exception", "on_train_epoch_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_before_backward", "on_after_backward",
)  # fmt: skip


class GPUBoost(Callback):
    """Turn on StreamPrefetch, AutoNumWorkers, SpanEpochs, GPUUtilWatchdog, TF32 and cuDNN autotuning with one
    callback.

    ``Trainer(callbacks=[GPUBoost()], precision=recommended_precision(), strategy="ddp_boost")`` is the whole
    change to a training script. Each part can be switched off; each keeps its own documented behaviour (see
    :class:`StreamPrefetch`, :class:`AutoNumWorkers`, :class:`SpanEpochs`, :class:`GPUUtilWatchdog`).

    Logged metrics:
        Those of its parts: ``gpu_boost/num_workers_train`` (AutoNumWorkers) and ``gpu_boost/data_wait_frac``,
        ``gpu_boost/gpu_util``, ... (GPUUtilWatchdog), ``bad_samples/train`` and ``bad_samples/val``
        (:class:`BadSampleReport`, for loaders that skip bad samples); one info line listing what it turned on.

    Args:
        prefetch: side-stream copy of the next batch (CUDA only).
        auto_workers: measure and set the train loader's ``num_workers``.
        watchdog: watch for data starvation.
        span_epochs: keep the workers of short-epoch train and validation loaders loading across epoch ends
            (:class:`SpanEpochs`: loaders whose epoch start costs at least 5 % of an epoch). Turn it off for a
            dataset that the main process changes per epoch (``on_train_epoch_start``).
        tf32: ``torch.set_float32_matmul_precision("high")`` (TF32 matmuls and convolutions on Ampere+).
        cudnn_benchmark: cuDNN autotuning for fixed input sizes. Where the training batches turn out to take more
            than 4 shapes (padded audio or text, multi-scale images), autotuning is turned off again with an info
            line: it would tune every new shape inside the step. The settings it changed (TF32, autotuning) are
            put back at ``teardown``, so that a later Trainer in the same process starts from the user's.
        channels_last: convert models with ``Conv2d`` layers to ``channels_last`` on CUDA (measured on an H100,
            ResNet-50 bf16 batch 256: 117 -> 67 ms per step); models without convolutions are left alone.
        normalize: ``(mean, std)`` for uint8 images, applied on the GPU by the prefetcher.
        normalize_dtype: dtype of normalized images.
        workers_budget_s: time budget of the worker probe.
        on_starvation: the watchdog's ``"warn"``, ``"raise"`` or ``"ignore"``.
        move_normalize: move a torchvision dataset's trailing ``ToTensor(), Normalize(mean, std)`` to the GPU
            (``StreamPrefetch(move_normalize=True)``): workers send uint8, the model gets the same normalized
            float32 images. Ignored when ``normalize`` is given.
        transform: a batch transform run on the GPU for training, overlapped with the step
            (``StreamPrefetch(transform=...)``: seeded per rank, epoch and batch).
        val_transform: the deterministic batch transform for validation, test and predict loaders.
        decode: where a recognized torchvision pipeline's JPEGs are decoded on CUDA (``StreamPrefetch(decode=...)``):
            ``"auto"`` times training with the CPU decode, the GPU decode and a split, and keeps the fastest (the
            CPU decode unless another is more than 3 % faster); ``"cpu"`` or ``"gpu"`` force it. See
            ``docs/gpu_decode.md``.

    Raises:
        ValueError: bad arguments of its parts (the parts' messages).

    Example::

        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[GPUBoost(watchdog=False)], precision=recommended_precision(), logger=False)
    """

    def __init__(
        self,
        prefetch: bool = True,
        auto_workers: bool = True,
        watchdog: bool = True,
        tf32: bool = True,
        cudnn_benchmark: bool = True,
        channels_last: bool = True,
        normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
        normalize_dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        workers_budget_s: float = 30.0,
        on_starvation: Literal["warn", "raise", "ignore"] = "warn",
        move_normalize: bool = True,
        transform: Callable[[Any], Any] | None = None,
        val_transform: Callable[[Any], Any] | None = None,
        span_epochs: bool = True,
        decode: Literal["auto", "cpu", "gpu"] = "auto",
    ) -> None:
        for name, value in (("prefetch", prefetch), ("auto_workers", auto_workers), ("watchdog", watchdog),
                            ("tf32", tf32), ("cudnn_benchmark", cudnn_benchmark), ("channels_last", channels_last),
                            ("move_normalize", move_normalize), ("span_epochs", span_epochs)):  # fmt: skip
            checks.check_bool(name, value)
        checks.check_normalize("normalize", normalize)
        checks.check_choice("normalize_dtype", normalize_dtype, ("float32", "bfloat16", "float16"))
        checks.check_number("workers_budget_s", workers_budget_s, low=0.0, low_open=True)
        checks.check_choice("on_starvation", on_starvation, ("warn", "raise", "ignore"))
        self.parts: dict[str, Callback] = {}
        if prefetch:  # first: its uint8 rewrite must precede AutoNumWorkers' probe
            self.parts["prefetch"] = StreamPrefetch(
                normalize=normalize,
                normalize_dtype=normalize_dtype,
                channels_last=channels_last and normalize is not None,
                move_normalize=move_normalize,
                transform=transform,
                val_transform=val_transform,
                decode=decode,
            )
        if auto_workers:
            self.parts["auto_workers"] = AutoNumWorkers(workers_budget_s=workers_budget_s)
        if span_epochs:  # after the tuner: it decides with the chosen worker count
            self.parts["span_epochs"] = SpanEpochs()
        if watchdog:
            self.parts["watchdog"] = GPUUtilWatchdog(on_starvation=on_starvation)
        # logs what loaders with bad_samples="skip" skipped (a no-op for any other loader)
        self.parts["bad_samples"] = BadSampleReport()
        self.tf32 = tf32
        self.cudnn_benchmark = cudnn_benchmark
        self.channels_last = channels_last
        #: what ``setup`` changed (``configure_backends``'s answer), and the settings it found
        self.applied: dict[str, Any] = {}
        self._found: dict[str, Any] | None = None
        self._shapes: ShapeWatch | None = None
        #: the parts that run in this fit: a part the Trainer has as a callback of its own runs as the user set it,
        #: and a second GPUBoost leaves everything to the first
        self.running: dict[str, Any] = dict(self.parts)

    @property
    def state_key(self) -> str:
        return "GPUBoost"

    def _forward(self, hook: str, *args: Any, **kwargs: Any) -> None:
        for part in list(self.running.values()):
            getattr(part, hook)(*args, **kwargs)

    def _duplicates(self, trainer: pl.Trainer) -> bool:
        """Which parts run this fit (:attr:`running`); ``True`` where another GPUBoost comes first (this one is off)."""
        first = next(c for c in trainer.callbacks if isinstance(c, GPUBoost))
        if first is not self:
            self.running = {}
            rank_zero_info("GPUBoost: another GPUBoost is among the Trainer's callbacks; this one stays off (the "
                           "first runs).")  # fmt: skip
            return True
        mine = {c for c in trainer.callbacks if c is not self}
        self.running = {n: p for n, p in self.parts.items() if not any(type(c) is type(p) for c in mine)}
        for name in self.parts.keys() - self.running.keys():
            rank_zero_info(f"GPUBoost: {type(self.parts[name]).__name__} is among the Trainer's callbacks already; it "
                           "runs as you set it, and GPUBoost's own stays off.")  # fmt: skip
        return False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._duplicates(trainer):
            return
        cuda = trainer.strategy.root_device.type == "cuda"
        if self._found is None:
            self._found = backend_settings()
        applied = self.applied = configure_backends(self.tf32 and cuda, self.cudnn_benchmark and cuda)
        self._shapes = ShapeWatch(VARIABLE_SHAPES) if applied.get("cudnn_benchmark") else None
        if self.channels_last and cuda and any(isinstance(m, torch.nn.Conv2d) for m in pl_module.modules()):
            pl_module.to(memory_format=torch.channels_last)
            applied["channels_last"] = True  # StreamPrefetch reads the model's layout for the images it normalizes
        best = recommended_precision(trainer.strategy.root_device)
        if cuda and str(trainer.precision) == "32-true" and best != "32-true":
            rank_zero_warn(f"GPUBoost: training in 32-true on a GPU that supports {best}; pass precision='{best}' "
                           "(lightning_gpu_boost.recommended_precision()) for faster steps.")  # fmt: skip
        rank_zero_info(f"GPUBoost: {', '.join(self.running) or 'no parts'}; backends {applied or 'unchanged'}.")
        self._forward("setup", trainer, pl_module, stage)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:  # fmt: skip
        if self._shapes is not None and self._shapes.see(batch):
            torch.backends.cudnn.benchmark = False
            self.applied["cudnn_benchmark"] = False
            self._shapes = None
            rank_zero_info(f"GPUBoost: the training batches took more than {VARIABLE_SHAPES} shapes in "
                           f"{batch_idx + 1} batches; cuDNN autotuning is off again (it would tune each new shape "
                           "inside the step).")  # fmt: skip
        self._forward("on_train_batch_start", trainer, pl_module, batch, batch_idx)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._forward("teardown", trainer, pl_module, stage)
        if self._found is not None:  # the next Trainer in this process starts from the user's settings
            restore_backends(self._found)
            self._found, self._shapes = None, None

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        self._forward("on_save_checkpoint", trainer, pl_module, checkpoint)
        if self.running:  # the running GPUBoost's parts (a checkpoint entry of its own: two GPUBoosts never clash)
            checkpoint[CHECKPOINT_KEY] = self.boost_state()

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get(CHECKPOINT_KEY) or checkpoint.get("callbacks", {}).get("GPUBoost")  # or as saved before
        if state is not None and self.running:
            self.load_boost_state(state)
        # a checkpoint at an epoch's last batch must not make a loader with its own state skip the next epoch
        if self.running and finish_ended_epoch(checkpoint):
            rank_zero_info("GPUBoost: the checkpoint was saved at an epoch's last batch; the train loader's own saved "
                           "state is marked finished so that the resumed run starts the next epoch (torchdata's "
                           "StatefulDataLoader would skip it).")  # fmt: skip
        self._forward("on_load_checkpoint", trainer, pl_module, checkpoint)

    def boost_state(self) -> dict[str, Any]:
        """Its parts' states, versioned (saved in the checkpoint under :data:`CHECKPOINT_KEY`, not through
        Lightning's ``state_dict``, which refuses two callbacks of one class)."""
        return {"version": 1, **{name: part.state_dict() for name, part in self.running.items()}}

    def load_boost_state(self, state: dict[str, Any]) -> None:
        from lightning_gpu_boost.core.state_version import check_state_version

        check_state_version("GPUBoost", state, 1)
        for name, part in self.running.items():
            if name in state:
                part.load_state_dict(state[name])


def _forwarder(hook: str) -> Any:
    def method(self: GPUBoost, *args: Any, **kwargs: Any) -> None:
        self._forward(hook, *args, **kwargs)

    method.__name__ = hook
    method.__doc__ = f"Forwards ``{hook}`` to the enabled parts."
    return method


for _hook in _HOOKS:
    if _hook not in GPUBoost.__dict__:
        setattr(GPUBoost, _hook, _forwarder(_hook))
