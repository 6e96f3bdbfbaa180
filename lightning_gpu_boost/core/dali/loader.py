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
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import torch

from lightning_gpu_boost._imports import require
from lightning_gpu_boost.core.dali.sources import DTYPES, Dtype, _Feeder, num_batches, rank_indices
from lightning_gpu_boost.core.fork import keep_dali_out_of_forks, shut_dali

__all__ = ['DALILoader', 'close_all']

class _EpochBadSamples:
    """Bad samples a loader dropped, by the epoch their batch belongs to (DALI reads into the next epoch ahead of
    time); the loader's :class:`~lightning_gpu_boost.core.bad_samples.BadSampleLog` reads it like a
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


#: every live DALILoader of this process (close_all)
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
    #: the run record's fact (:mod:`~lightning_gpu_boost.callbacks._run_facts`): it decodes with DALI
    dali = True
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
        #: bad samples dropped (``bad_samples="skip"``), per index; with ``sample_path`` for the log
        self.bad_sample_tracker = _EpochBadSamples(self)
        #: warns at each epoch's end with the samples it skipped (``bad_samples="skip"``; a DataModule sets its own)
        self.bad_sample_log: Any = None
        if bad_samples == "skip":
            from lightning_gpu_boost.core.bad_samples import BadSampleLog

            self.bad_sample_log = BadSampleLog(self)
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
        keep_dali_out_of_forks()  # a DataLoader's worker forked meanwhile (a validation loader's) forgets it
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

        from lightning_gpu_boost.core.refill import Counted, Refill

        resume = saved.get("refill") if applies else None  # type: ignore[union-attr]
        start = int(resume["source"]) if resume else 0
        counted = (Counted(batch, len(batch[-1]), ["B"] * len(batch)) for batch in self._run(epoch, start))
        self._refill = refill = Refill(counted, self.batch_size, len(self), warn=warnings.warn, resume=resume)
        self._place = (epoch, int(resume["emitted"]) if resume else 0)
        log = self.bad_sample_log
        for batch in refill if log is None else log.watch(refill, epoch):
            self._place = (epoch, self._place[1] + 1)
            yield batch

    def local_state_dict(self) -> dict[str, Any]:
        """This rank's place: ``{"epoch": e, "batches": k}`` (and where bad samples are skipped, the place in the
        re-formed batches)."""
        state: dict[str, Any] = {"version": 1, "epoch": self._place[0], "batches": self._place[1]}
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
        from lightning_gpu_boost.core.state_version import check_state_version

        if state:
            state = own_rank(state)
            check_state_version("DALILoader", state, 1)
            self._saved = dict(state)

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
        for pipe in self._pipes:
            shut_dali(pipe)
        self._pipes, self._pos = [], 0
        self._stream.clear()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError(
            "A DALILoader holds a live DALI pipeline and cannot be pickled; build one per process."
        )
