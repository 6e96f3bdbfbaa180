"""The Lightning adapter of the GPU decode (:mod:`~lightning_gpu_boost.core.gpu_decode`): the data path's
``decode`` stage, the decoder the ``copy`` stage runs, and the placement ``decode="auto"`` measures in training.
Used by :class:`~lightning_gpu_boost.callbacks.StreamPrefetch` (its ``decode`` argument)."""

from __future__ import annotations

import math
import time
import weakref
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, default_collate

from lightning_gpu_boost.callbacks._data_path import add_stage, data_path, remove_stage
from lightning_gpu_boost.core.cpus import processes_per_node
from lightning_gpu_boost.core.gpu_decode import (
    BatchDecoder,
    DecodePlan,
    DecoderChoice,
    Share,
    SplitSearch,
    agreed,
    give_back,
    split_worker_cpus,
    take_over,
)
from lightning_gpu_boost.core.steady import queue_batches

__all__ = ["DecodeMode", "GPUDecodeStage"]

DecodeMode = Literal["auto", "cpu", "gpu"]
_TRAIN = ("train", "fit", None)


def _share_text(share: float) -> str:
    return "gpu" if share >= 1.0 else "cpu" if share <= 0.0 else f"gpu {share:.0%}"


class GPUDecodeStage:
    """One Trainer's GPU decode: which loaders' datasets it took over (with their :class:`Share`), their decoders,
    and the split search of ``"auto"``."""

    def __init__(self, mode: DecodeMode) -> None:
        self.mode = mode
        self._taken: weakref.WeakKeyDictionary[DataLoader, tuple[Share, str | None, DecodePlan]] = (
            weakref.WeakKeyDictionary())  # fmt: skip
        self._decoders: weakref.WeakKeyDictionary[DataLoader, BatchDecoder] = weakref.WeakKeyDictionary()
        self.search = SplitSearch() if mode == "auto" else None  # sized for the node's ranks at attach
        self.choice: DecoderChoice | None = None  # after a GPU share is placed: the JPEG engines or the CUDA decoder
        self.share = 1.0 if mode == "gpu" else 0.0
        self.why = "decode='gpu'" if mode == "gpu" else "measuring: the CPU decode first"
        self._trainer: Any = None
        self._processes = 1
        self._group: Any = None  # the gloo group the ranks' search figures go through (DDP)

    def attach(self, trainer: Any) -> None:
        self._trainer = trainer
        self._processes = processes_per_node(trainer)  # the node's ranks: their workers leave CPUs to each
        if self.search is not None:
            self.search.worker_cpus = split_worker_cpus(self._processes)
        add_stage(trainer, "decode", f"GPUDecode-{id(self)}", self.take)

    def take(self, loader: Any, stage: str | None) -> Any:
        """The ``decode`` stage: take a recognized dataset over (its workers then send JPEGs and parameters)."""
        if not isinstance(loader, DataLoader) or loader in self._taken:
            return loader
        if loader.batch_size is None or loader.collate_fn is not default_collate:
            return loader  # a collate of the user's own expects the images the transform makes
        share = Share(self.share)
        plan = take_over(loader.dataset, share, self._processes)
        if plan is None:
            return loader
        self._taken[loader] = (share, stage, plan)
        facts = data_path(self._trainer).facts(loader)
        facts.decode, facts.decode_why = _share_text(self.share), self.why
        facts.decode_measuring = self.search is not None and self.search.decision is None
        rank_zero_info(f"StreamPrefetch: the {stage or ''} dataset's JPEGs are decoded by "
                       f"{'the GPU' if self.mode == 'gpu' else 'the workers while the placement is measured'}; "
                       f"{len(plan.steps)} transforms before ToTensor follow each sample's drawn parameters "
                       "(decode='cpu' turns this off).")  # fmt: skip
        return loader

    def decoder_names(self) -> list[str]:
        """What decoded the JPEGs on the GPU, per loader (the JPEG engines or nvJPEG, and why not the engines)."""
        return sorted({d.decoder_name for d in self._decoders.values()})

    def decoder(self, loader: Any, device: Any, dtype: str, channels_last: bool) -> BatchDecoder | None:
        """The decoder of ``loader``'s batches where its dataset was taken over, else ``None``."""
        taken = self._taken.get(loader) if isinstance(loader, DataLoader) else None
        if taken is None:
            return None
        plan = taken[2]
        if self.search is not None and taken[1] in _TRAIN:  # the batches the loader holds ahead are not timed
            self.search.settle = max(self.search.settle, queue_batches(loader) + 3)
        decoder = BatchDecoder(plan.mean, plan.std, device=device, dtype=dtype, channels_last=channels_last)
        self._decoders[loader] = decoder
        return decoder

    def _set(self, share: float, why: str, final: bool = False) -> None:
        self.share, self.why = share, why
        for loader, (shared, stage, _) in list(self._taken.items()):
            if stage in _TRAIN or final:
                shared.value = share
            facts = data_path(self._trainer).facts(loader)
            facts.decode, facts.decode_why = _share_text(shared.value), why
            facts.decode_measuring = not final

    @property
    def decision(self) -> Any:
        """The placement decided (with the decoder where :class:`DecoderChoice` chose it), else ``None``."""
        return self.choice.decision if self.choice is not None else self.search.decision if self.search else None

    def batch_share(self) -> float | None:
        """The GPU share of the last training batch decoded."""
        return self._last_batch()[0]

    def _train_decoder(self) -> BatchDecoder | None:
        for loader, (_, stage, _) in list(self._taken.items()):
            if stage in _TRAIN and self._decoders.get(loader) is not None:
                return self._decoders[loader]
        return None

    def _last_batch(self) -> tuple[float | None, float | None, int | None, float | None]:
        """The GPU share of the last training batch decoded, when and by which worker it was made, and the share
        for the JPEG engines of the DALI pipelines that decoded it."""
        decoder = self._train_decoder()
        if decoder is None:
            return None, None, None, None
        # as handed out, where a thread decodes ahead of the step
        return decoder.handed_out or (decoder.last_share, decoder.last_made_at, decoder.last_made_by,
                                      decoder.last_engine_load)  # fmt: skip

    def engines_choosable(self, share: float) -> bool:
        """Whether the placed ``share`` is decoded by DALI on a GPU: the engines' share of it is then chosen too."""
        decoder = self._train_decoder()
        return share > 0.0 and decoder is not None and bool(decoder._dali) and decoder.device.type == "cuda"

    def _set_engines(self, load: float | None) -> None:
        for decoder in list(self._decoders.values()):
            decoder.engine_load = load

    def on_train_batch_end(self, trainer: Any) -> None:
        """``"auto"``: time this batch for the split search, then for the decoder's choice; under DDP every rank
        runs them on the same figures."""
        timer = self.choice or self.search
        if timer is None or timer.decision is not None or not self._taken:
            return
        proposal, decided = self._search_step(trainer, timer)
        # the CUDA decoder is timed where DALI decodes on a GPU: in place of the JPEG engines at the placed share,
        # or decoding every sample where the search kept the CPU decode
        if decided is not None and timer is self.search and self._every_rank(
                trainer, self.engines_choosable(decided.share or 1.0)):  # fmt: skip
            placed = decided.share > 0.0
            self.choice = DecoderChoice.after(self.search) if placed else DecoderChoice.against_cpu(self.search)
            self._set_engines(0.0)
            self._set(self.choice.share, "measuring: nvJPEG's CUDA decoder in place of the JPEG engines" if placed
                      else "measuring: nvJPEG's CUDA decoder decoding every sample")  # fmt: skip
        elif decided is not None:
            # the decoder kept, or the pipelines' default where the CPU decode stays
            self._set_engines(decided.engine_load)
            self._set(decided.share, decided.why, final=True)
            data_path(trainer).choices.choose("decode", _share_text(decided.share), by="StreamPrefetch",
                                              why=decided.why)  # fmt: skip
            rank_zero_info(f"StreamPrefetch: decode placed by measurement: {decided.why}.")
        elif proposal is not None and timer is self.search:
            self._set(proposal, f"measuring: GPU share {proposal:.0%}")

    def _every_rank(self, trainer: Any, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (with torch.distributed: all of them; else rank 0's), so that the
        ranks step the same timer: a rank that timed the decoder's choice alone would wait for the others."""
        import torch.distributed as dist

        if trainer.world_size <= 1:
            return flag
        if dist.is_available() and dist.is_initialized() and self._group is not None:
            agreed_flag = torch.tensor([1.0 if flag else 0.0])
            dist.all_reduce(agreed_flag, op=dist.ReduceOp.MIN, group=self._group)
            return bool(agreed_flag.item())
        return bool(trainer.strategy.broadcast(flag, src=0))

    def _search_step(self, trainer: Any, timer: Any = None) -> tuple[float | None, Any]:
        """One batch of the search (or of the decoder's choice, ``timer``): what to set where it changes, and the
        decision once made. Each batch shows the share it was made under (the decoder's choice: the engine load it
        was decoded with). Under DDP the ranks' last batches go through a gloo group (no wait for the GPU) and every
        rank steps the search with :func:`~lightning_gpu_boost.core.gpu_decode.agreed`'s figures (settling for the
        most batches any rank holds ahead), so every rank sets the same shares."""
        import torch.distributed as dist

        timer = timer or self.search
        share, made_at, made_by, load = self._last_batch()
        if timer is self.choice:
            share = load
        now = time.monotonic()  # the clock the workers stamp their batches with
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            if self._group is None:  # every rank comes here at the same batch: new_group is collective
                self._group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
            mine = torch.tensor([now, *(math.nan if v is None else float(v) for v in (share, made_at, made_by)),
                                 timer.settle], dtype=torch.float64)  # fmt: skip
            gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(gathered, mine, group=self._group)
            rows = [row.tolist() for row in gathered]
            # each rank's workers were counted on its own: the most batches any rank holds ahead settle every rank
            timer.settle = int(max(row[4] for row in rows))
            now, share, made_at, made_by = agreed([row[:4] for row in rows], timer.tolerance)
        elif trainer.world_size > 1:  # ranks without torch.distributed: rank 0 decides, every rank follows
            proposal = timer.step(now, share, made_at, made_by) if trainer.global_rank == 0 else None
            message = (proposal, timer.decision) if trainer.global_rank == 0 else None
            proposal, timer.decision = trainer.strategy.broadcast(message, src=0)
            return proposal, timer.decision
        return timer.step(now, share, made_at, made_by), timer.decision

    def _drop_group(self) -> None:
        """The search's own gloo group, where it made one: its sockets go (a later fit makes another)."""
        import torch.distributed as dist

        if self._group is not None and self._group is not dist.group.WORLD and dist.is_initialized():
            dist.destroy_process_group(self._group)
        self._group = None

    def restart_window(self) -> None:
        """An epoch's end or a validation run comes between two training batches: time the window again."""
        timer = self.choice or self.search
        if timer is not None:
            timer.restart_window()

    def detach(self) -> None:
        for loader in list(self._taken):
            give_back(loader.dataset)
            # persistent workers hold copies of the taken-over dataset: a later fit of the same loader without the
            # GPU decode would get records, so they stop here (the loader starts fresh ones when iterated again)
            iterator = getattr(loader, "_iterator", None)
            if iterator is not None and hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
                loader._iterator = None
        self._taken.clear()
        for decoder in list(self._decoders.values()):  # DALI's pipelines: their threads and GPU memory
            decoder.close()
        self._drop_group()
        if self._trainer is not None:
            remove_stage(self._trainer, f"GPUDecode-{id(self)}")
        self._trainer = None
