"""One verdict taxonomy for the watchdog and ``doctor``: what limits a training run, and the change that fixes it
*in this run's configuration*.

Verdicts (:data:`VERDICTS`):

- ``data-bound``: steps wait for their batch and the GPU idles meanwhile: the loader is the limit.
- ``copy-bound``: steps wait, and most of the wait is the host-to-GPU copy (estimated from the batch's bytes).
- ``remote-io-bound``: steps wait for their batch while the loader's workers sit idle and the stream's local cache
  grows: the wait is on downloads from object storage, not on the CPU. The fix is on the download side (chunks
  fetched further ahead, larger chunks, more workers downloading at once, a cache that holds the stream).
- ``host-bound``: steps hardly wait for data, yet the GPU idles *inside* the step: the step synchronizes with the
  GPU (``.item()``, ``.cpu()``, printing a tensor), runs Python between kernels, or launches kernels slower than
  they run. No data change helps.
- ``small``: the GPU is busy and waits for nothing, with little of its memory in use and steps of a few
  milliseconds (where fixed per-kernel costs weigh), or with few of its SMs active (NVML GPM, where measured):
  a larger batch may raise throughput. Not a problem to warn
  about. Steps of tens of milliseconds are ``ok`` whatever the memory in use (NVML cannot see how full the SMs are;
  ResNet-50 at batch 256 in bf16 fills 17 % of an H100's memory and runs at its ceiling).
- ``between-steps``: time outside the steps (epoch ends with worker restarts, validation, checkpoints) is a large
  share of the run: the per-step accounting leaves it out, so it gets its own verdict.
- ``ok``: compute-bound: the GPU is the limit.

Advice never names an option that is already on (a worker tuner that ran, prefetching, pinned memory, persistent
workers), never a data fix for a host-bound step, and where the fix is ours it gives the line to write. Nothing here
needs a Trainer or CUDA: :class:`RunFacts` describes the run, :class:`Evidence` what was measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_gpu_boost.core.shapes import tensors_in

__all__ = ['span_bound', 'BETWEEN_STEPS_SHARE', 'COPY_SHARE', 'Evidence', 'IDLE_WORKERS', 'STARVED', 'byte_rate', 'downloading', 'RunFacts', 'SMALL_MEMORY', 'SMALL_SM_ACTIVE', 'SMALL_STEP_MS', 'VERDICTS', 'Verdict', 'advise', 'batch_kind', 'classify', 'crowded', 'fetches_batches', 'format_advice', 'sample_cost_fixes']

Verdict = Literal["data-bound", "copy-bound", "remote-io-bound", "host-bound", "small", "between-steps", "ok"]
VERDICTS: tuple[str, ...] = ("data-bound", "copy-bound", "remote-io-bound", "host-bound", "small", "between-steps",
                             "ok")
#: the verdicts of a run that waits for its data
STARVED: tuple[str, ...] = ("data-bound", "copy-bound", "remote-io-bound")

#: a verdict of ``between-steps`` where time outside the steps is at least this share of the run
BETWEEN_STEPS_SHARE = 0.25
#: a wait counts as copy-bound where the estimated copy is at least this share of it
COPY_SHARE = 0.5
#: memory in use below this share of the GPU makes a busy GPU with short steps "small"
SMALL_MEMORY = 0.3
#: steps shorter than this (ms) on a busy GPU with little memory in use are "small"
SMALL_STEP_MS = 15.0
#: a busy GPU whose SMs are active less than this share of the time (%, NVML GPM) is "small"
SMALL_SM_ACTIVE = 40.0
#: a data wait is on downloads where the workers spend less than this share of their time on a CPU while the
#: stream's cache grows (workers that decode keep a CPU busy: 0.9-1.0 of their time when they are the limit)
IDLE_WORKERS = 0.5


@dataclass
class Evidence:
    """What was measured over a window of steps (``None``: not measured, e.g. no NVML on a CPU run)."""

    data_wait_frac: float
    step_ms: float
    data_wait_ms: float = 0.0
    gpu_util: float | None = None
    gpu_mem_frac: float | None = None
    #: estimated host-to-GPU copy per step, ms (batch bytes over the measured bandwidth)
    copy_ms: float | None = None
    #: share of the run's wall time spent outside the steps (epoch ends, validation, checkpoints)
    between_frac: float | None = None
    #: of that, validation's share of the run's wall time
    validation_frac: float | None = None
    #: of that, later epochs' starts to their first batch (the loader starting its workers again)
    epoch_start_frac: float | None = None
    #: share of the SMs busy (%, NVML GPM on Hopper and newer), ``None`` where not measured
    sm_active: float | None = None
    #: share of the loader workers' time spent on a CPU (:class:`~lightning_gpu_boost.core.worker_cpu.WorkerCPU`)
    workers_busy: float | None = None
    #: bytes/s arriving in a remote stream's local cache (its downloads), ``None`` where no stream is read
    download_bytes_s: float | None = None


@dataclass
class RunFacts:
    """The run's configuration, as far as it decides the advice."""

    cuda: bool = False
    num_workers: int | None = None
    usable_cpus: int = 1
    batch_size: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    #: batches are copied on a side stream ahead of the step (StreamPrefetch, GPUBoost, our DataModules)
    prefetch: bool = False
    #: the train loader is a DALI pipeline
    dali: bool = False
    #: the dataset ships uint8 images (our image datasets)
    uint8_images: bool = False
    #: a worker tuner (AutoNumWorkers, GPUBoost, ``num_workers="auto"``) is part of this run
    tuner: bool = False
    #: what the tuner measured (a :class:`~lightning_gpu_boost.core.workers.WorkerProbe`), where it ran
    probe: Any = None
    #: validation loaders (``num_workers``, ``persistent_workers``) where known
    val_loaders: list[tuple[int, bool]] = field(default_factory=list)
    #: samples per training epoch in batches, where known
    batches_per_epoch: int | None = None
    #: what a batch holds (:func:`batch_kind`): the advice for a sample's cost depends on it
    batch_kind: str | None = None
    #: the loader fetches whole batches at once (the dataset has ``__getitems__``, or ``batch_size=None``)
    batched_fetch: bool = False
    #: the train loader runs through a SpanningLoader (its workers load across epoch ends)
    spans_epochs: bool = False
    #: where the GPU decode placed this loader's JPEG decoding (``"cpu"``, ``"gpu"``, a split ``"gpu 48 %"``), or
    #: ``None`` where it did not take the dataset over; ``decode_takes``: a pipeline it would take (a torchvision
    #: ``ImageFolder`` with the transforms it knows)
    decode: str | None = None
    decode_takes: bool = False
    #: ``decode="auto"`` is still timing the shares: its steps are its own (work moved between the workers and the
    #: GPU), not the user's to fix nor a worker count's
    decode_measuring: bool = False
    #: settings one of our parts chose in this run, ``setting -> part`` (the run record): advice never names a
    #: value for them; the part is asked to decide again instead
    chosen_by: dict[str, str] = field(default_factory=dict)
    #: the train loader streams from object storage: ``{"url", "max_pre_download"}``
    #: (:func:`~lightning_gpu_boost.core.streaming.source.remote_stream`), else ``None``
    remote_stream: dict[str, Any] | None = None


def crowded(f: RunFacts) -> bool:
    """The loader's workers can use every CPU and leave none to the training process, which launches the kernels."""
    return f.num_workers is not None and f.usable_cpus > 1 and f.num_workers >= f.usable_cpus


def fetches_batches(loader: Any) -> bool:
    """Whether ``loader`` (a DataLoader) fetches a batch's samples in one call: its dataset has ``__getitems__``, or
    it yields what its sampler names as a whole (``batch_size=None``)."""
    dataset = getattr(loader, "dataset", None)
    return hasattr(dataset, "__getitems__") or (hasattr(loader, "batch_size") and loader.batch_size is None)


def batch_kind(batch: Any) -> str | None:
    """What a batch holds, from its tensors' shapes and types: ``"images+masks"`` (N x C x H x W images with
    N x H x W integer masks), ``"images"``, ``"features"`` (N x T x F floats: spectrograms, padded sequences),
    ``"tokens"`` (N x T integers), ``"rows"`` (N x F floats); ``None`` where none fits."""
    tensors = tensors_in(batch)
    floating = [t for t in tensors if getattr(t.dtype, "is_floating_point", False)]
    integer = [t for t in tensors if not getattr(t.dtype, "is_floating_point", True) and str(t.dtype) != "torch.bool"]
    images = [t for t in tensors if t.ndim == 4 and (t.shape[1] in (1, 3, 4) or t.shape[-1] in (1, 3, 4))]
    if images:
        n, h, w = images[0].shape[0], images[0].shape[-2], images[0].shape[-1]
        masks = [t for t in integer if t.ndim == 3 and tuple(t.shape) == (n, h, w)]
        return "images+masks" if masks else "images"
    if any(t.ndim == 3 for t in floating):
        return "features"
    if any(t.ndim == 2 for t in integer):
        return "tokens"
    if any(t.ndim == 2 for t in floating):
        return "rows"
    return None


def classify(
    e: Evidence, wait_threshold: float = 0.2, util_threshold: float = 80.0, include_between: bool = False
) -> Verdict:
    """The verdict for ``e``: see the module's docstring. ``include_between`` also weighs time outside the steps
    (at the end of a run; per window there is none)."""
    util_known = e.gpu_util is not None and not math.isnan(e.gpu_util)
    low_util = not util_known or e.gpu_util < util_threshold
    if include_between and e.between_frac is not None and e.between_frac >= BETWEEN_STEPS_SHARE:
        return "between-steps"
    if not math.isnan(e.data_wait_frac) and e.data_wait_frac >= wait_threshold and low_util:
        if e.copy_ms is not None and e.data_wait_ms > 0 and e.copy_ms >= COPY_SHARE * e.data_wait_ms:
            return "copy-bound"
        if downloading(e):
            return "remote-io-bound"
        return "data-bound"
    if util_known and e.gpu_util < util_threshold:
        return "host-bound"
    if util_known and e.gpu_mem_frac is not None and e.gpu_mem_frac < SMALL_MEMORY and e.step_ms < SMALL_STEP_MS:
        return "small"
    if util_known and e.sm_active is not None and e.sm_active < SMALL_SM_ACTIVE:
        return "small"  # kernels run all the time, on few of the SMs: utilization reads busy, the GPU is not
    return "ok"


def downloading(e: Evidence) -> bool:
    """The workers sit idle while the stream's cache grows: a wait for data is a wait on the link."""
    return (e.download_bytes_s is not None and e.download_bytes_s > 0 and e.workers_busy is not None
            and e.workers_busy < IDLE_WORKERS)  # fmt: skip


def byte_rate(bytes_s: float) -> str:
    """``"1.5 MiB/s"``, ``"240 KiB/s"``."""
    return f"{bytes_s / 2**20:,.1f} MiB/s" if bytes_s >= 2**20 else f"{bytes_s / 2**10:,.0f} KiB/s"


def _join(options: list[str]) -> str:
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]


def advise(verdict: Verdict, facts: RunFacts, e: Evidence | None = None) -> list[str]:
    """The changes that fix ``verdict`` in this run, most effective first; none that is already in place."""
    f = facts
    advice: list[str] = []
    if verdict in ("data-bound", "copy-bound"):
        if verdict == "copy-bound":
            if f.cuda and not f.prefetch:
                advice.append(
                    "copy the next batch on a side stream while this step computes: "
                    "Trainer(callbacks=[StreamPrefetch()])."
                )
            if f.cuda and f.pin_memory is False:
                advice.append("pin_memory=False makes every host-to-GPU copy synchronous: set pin_memory=True.")
            if not f.uint8_images:
                advice.append(
                    "ship fewer bytes: uint8 images normalized on the GPU (StreamPrefetch(normalize=(mean, std)) "
                    "or ImageFolderDataModule), bfloat16 features, or int32 token ids instead of int64."
                )
            return advice or ["the copy runs at the link's speed: fewer bytes per sample is the remaining fix."]
        advice += _loader_advice(f, e)
        return advice
    if verdict == "remote-io-bound":
        return _remote_advice(f, e)
    if verdict == "host-bound":
        util = "" if e is None or e.gpu_util is None else f" ({e.gpu_util:.0f} % utilization while steps wait " \
            f"{100 * e.data_wait_frac:.0f} % for data)"
        too_many: list[str] = []
        if crowded(f) and "num_workers" not in f.chosen_by:
            # the workers' per-sample work takes every core from the process that launches the GPU's kernels
            too_many = [
                f"the loader's {f.num_workers} workers can use all {f.usable_cpus} CPUs and leave none to the "
                f"training process, which launches the GPU's kernels: set num_workers={f.usable_cpus - 1}, or move "
                "per-sample work to the GPU (StreamPrefetch(transform=...)) so that fewer workers keep up;"
            ]
        return too_many + [
            f"the GPU idles inside the step{util}, so data is not the limit and more workers will not help: remove "
            "per-step synchronizations (.item(), .cpu(), .tolist(), printing tensors, torch.cuda.synchronize(); "
            "log tensors with self.log(...), which does not sync each step) and Python work between kernels;",
            "cut kernel-launch overhead with torch.compile(model) (mode='reduce-overhead' captures CUDA graphs), "
            "or amortize the per-step host cost with a larger batch.",
        ]
    if verdict == "small":
        return [
            "the data path is not the limit; a larger batch (Lightning's BatchSizeFinder callback) or fewer, larger "
            "kernels (torch.compile) may raise throughput."
        ]
    if verdict == "between-steps":
        return _between_advice(f, e)
    return ["nothing to change: the " + ("GPU" if f.cuda else "training step") + " is the limit."]


def _stream_advice(f: RunFacts) -> list[str]:
    """A stream from object storage: where steps wait while chunks are still being downloaded (the first epoch, or
    every epoch where the cache cannot hold the stream), the fix is on the download side, not the CPU's."""
    stream = f.remote_stream or {}
    ahead = stream.get("max_pre_download")
    more = f"StreamingDataModule(max_pre_download={2 * ahead}), {ahead} now" if ahead else "max_pre_download"
    return [
        f"while chunks are downloaded from {stream.get('url')} (the first epoch, or every epoch where the local "
        f"cache cannot hold the stream), steps wait on the link, not on the CPU: let each worker download more chunks "
        f"ahead ({more}), write larger chunks where the store's per-request latency dominates "
        "(write_image_stream(chunk_bytes=...)), and keep cache_dir on a local NVMe disk with max_cache_size above "
        "the stream's size, so that later epochs read it locally; where the wait stays with a warm cache:"
    ]


def _remote_advice(f: RunFacts, e: Evidence | None) -> list[str]:
    """Steps wait on downloads: the fixes on the download side, the one with the most effect first."""
    stream = f.remote_stream or {}
    url, ahead, workers = stream.get("url", "the store"), stream.get("max_pre_download"), f.num_workers
    seen = ""
    if e is not None and e.workers_busy is not None and e.download_bytes_s is not None:
        seen = (f" (the workers spend {100 * e.workers_busy:.0f} % of their time on a CPU while "
                f"{byte_rate(e.download_bytes_s)} arrive in the cache)")  # fmt: skip
    advice = [
        f"steps wait on downloads from {url}, not on the CPU{seen}: let each worker download more chunks ahead "
        + (f"(StreamingDataModule(max_pre_download={2 * ahead}), {ahead} now)" if ahead else "(max_pre_download)")
    ]
    if workers is not None and workers < max(2, f.usable_cpus - 1) and "num_workers" not in f.chosen_by:
        advice.append(
            f"more workers download at once (each worker downloads its own chunks, one after another): num_workers="
            f"{workers} now, set it to about {max(2, f.usable_cpus - 1)} when the run starts (a stream's loader keeps "
            "its count for a whole run; AutoNumWorkers leaves it alone)"
        )
    advice += [
        "write larger chunks where the store's per-request latency dominates (write_image_stream(chunk_bytes=...))",
        "keep cache_dir on a local NVMe disk with max_cache_size above the stream's size: later epochs then read it "
        "locally and do not wait on the link",
    ]
    return advice


def _loader_advice(f: RunFacts, e: Evidence | None = None) -> list[str]:
    # a stream whose workers were seen busy on the CPU waits on decoding, not on the link: no download advice first
    busy = e is not None and e.workers_busy is not None and e.workers_busy >= IDLE_WORKERS
    advice: list[str] = _stream_advice(f) if f.remote_stream and not busy else []
    workers = f.num_workers
    probe = f.probe
    if f.dali:
        return [
            "the DALI pipeline cannot keep up: where it decodes on the CPU, raise num_threads or switch "
            "DALIDataModule to decoder_device='mixed' (GPU decoding); where it decodes on the GPU, try "
            "decoder_device='cpu' if CPU cores are idle, or raise hw_decoder_load; slow storage: raise read_threads "
            "or pack the files into LMDB."
        ]
    if workers is not None:
        rows_fix = f.batch_kind == "rows" and not (probe is not None and probe.num_workers == workers)
        if rows_fix:  # per-sample Python: batched fetching beats any worker count (3.3 M vs 0.93 M rows/s measured)
            advice += sample_cost_fixes(f)
        if f.remote_stream and "num_workers" not in f.chosen_by:  # the count is part of its resume state: the user's
            if workers < f.usable_cpus - 1:
                advice.append(
                    f"{workers} workers decode and download: set num_workers to about {max(1, f.usable_cpus - 1)} when "
                    "the run starts (a stream's loader keeps its count for a whole run; AutoNumWorkers leaves it alone)."
                )
            else:
                advice.append("the workers already use every CPU, so CPU-side loading is the ceiling: "
                              + _join(sample_cost_fixes(f)) + ".")  # fmt: skip
        elif probe is not None and probe.num_workers == workers and not probe.conclusive:
            advice.append(
                f"num_workers={workers} is yours, kept because the worker probe could not rank the counts within its "
                f"budget ({probe.reason}): raise its budget_s (AutoNumWorkers/GPUBoost workers_budget_s)."
            )
        elif probe is not None and probe.num_workers == workers:
            table = ", ".join(f"{w}: {r:.1f}" for w, r in sorted(probe.table.items()))
            how = (f"was chosen for this loader alone ({probe.reason}; batches/s by workers: {table})" if probe.reason
                   else f"was measured as the fastest count for this loader alone (batches/s by workers: {table})")
            advice.append(
                f"num_workers={workers} {how}; more workers do not load faster, so each sample's cost is the ceiling: "
                + _join(sample_cost_fixes(f))
                + "."
            )
        elif f.tuner:
            advice.append(
                f"num_workers={workers} was set by the worker tuner in this run; each sample's cost is the "
                "ceiling: " + _join(sample_cost_fixes(f)) + "."
            )
        elif workers == 0:
            advice.append(
                "num_workers=0 loads every batch in the training process: add AutoNumWorkers() to the Trainer "
                f"callbacks (or set num_workers to about {max(1, f.usable_cpus - 1)})."
            )
        elif workers < f.usable_cpus - 1:
            advice.append(
                f"only {workers} of {f.usable_cpus} CPUs load data: add AutoNumWorkers() to measure the best count."
            )
        else:
            advice.append(
                "the workers already use every CPU, so CPU-side loading is the ceiling: "
                + _join(sample_cost_fixes(f))
                + "."
            )
        if f.cuda and f.pin_memory is False:
            advice.append("pin_memory=False makes every host-to-GPU copy synchronous: set pin_memory=True.")
        if workers > 0 and f.persistent_workers is False:
            advice.append("persistent_workers=False restarts the workers every epoch: set it to True.")
    else:
        advice.append("the train loader is not a torch DataLoader; check how fast it yields batches alone.")
    if f.cuda and not f.prefetch:
        advice.append("StreamPrefetch() copies the next batch on a side stream while this step computes.")
    return advice


def sample_cost_fixes(f: RunFacts) -> list[str]:
    """What makes one sample cheaper to load, for what the batches hold (images, features, tokens, rows); shared
    by the watchdog and ``doctor``."""
    kind = f.batch_kind
    sample_ms = getattr(f.probe, "sample_ms", None) if f.probe is not None else None
    cheap = sample_ms is not None and sample_ms < 0.05 and (f.batch_size or 0) >= 256
    if (kind == "rows" or cheap) and f.batched_fetch:
        return [
            "keep the table on the GPU if it fits: the loader yields only a batch's indices and the rows are gathered "
            "there, per batch (StreamPrefetch(transform=lambda idx: (x_gpu[idx], y_gpu[idx])) or GPUBoost(transform="
            "...)); whole batches are fetched at once already, and moving them costs more than the step"
        ]
    if kind == "rows" or cheap:
        per = f"a sample costs {1000 * sample_ms:.0f} µs, so " if sample_ms is not None else ""
        return [
            f"fetch whole batches at once ({per}per-sample Python and collate dominate): give the dataset "
            "__getitems__(indices) that indexes all of a batch's rows in one call (the DataLoader uses it), or keep "
            "the table as tensors and index them with a BatchSampler as the sampler and batch_size=None"
        ]
    if kind == "tokens":
        return [
            "tokenize once ahead (a np.memmap of token ids, as nanoGPT does) instead of in the workers",
            "read windows as slices of that memmap, which cost microseconds",
        ]
    if kind == "features":
        return [
            "compute the features on the GPU per batch: ship the raw waveforms (int16 or float) padded with their "
            "lengths and run resampling and the spectrogram there: StreamPrefetch(transform=LogMel(source_rate=...)) "
            "from lightning_gpu_boost.core.gpu_transforms (3.3x the CPU-feature loader at 4 workers on the H100), or "
            "torch.stft / torchaudio.functional on CUDA tensors",
            "or compute them once ahead and store them (an LMDB pack or a memmap)",
        ]
    fixes = []
    if kind == "images+masks":
        fixes.append(
            "run the geometric and colour augmentation on the GPU per batch, the same parameters for image and mask: "
            "StreamPrefetch(transform=JointAugment(size=..., degrees=..., elastic=...)) from "
            "lightning_gpu_boost.core.gpu_transforms (3.9x the 16-worker CPU loader on the H100), or kornia.augmentation "
            "/ torchvision.transforms.v2 on CUDA tensors; keep only decoding in the workers"
        )
    if f.cuda and f.decode is None and f.decode_takes:  # one voice: never undo a placement our part measured
        fixes.append(
            "decode the JPEGs on the GPU: GPUBoost() (its decode=\"auto\" times the CPU and the GPU decode in "
            "training and keeps the faster) or StreamPrefetch(decode=\"gpu\") take this torchvision pipeline as "
            "written (ResNet-50 with 4 CPUs on the H200, DALI installed: 3.8x the CPU decode)"
        )
    if not f.uint8_images and f.decode is None:
        fixes.append(
            "ship uint8 images and normalize on the GPU (ImageFolderDataModule or StreamPrefetch(normalize=...))"
        )
    if f.cuda and kind != "images+masks" and f.decode is None:
        fixes.append("decode images with NVIDIA DALI (DALIDataModule)")
    fixes.append(
        "make each sample cheaper to load (pre-resized images: lightning-gpu-boost pack --max-side N; fewer CPU "
        "transforms)"
    )
    return fixes


def span_bound(e: Evidence | None) -> float | None:
    """The most that keeping the workers loading across epoch ends (``SpanEpochs``) can give, as a factor on the
    samples/s: the time outside the steps gone, ``1 / (1 - between_frac)``; ``None`` where that time was not
    measured. An upper bound: spanned, the workers may set the pace (short_epochs on an H100: 2.91x bound, 1.30x
    measured, data-bound after). The workers' CPU share does not cap it soundly: it counts their start-up and the
    validation batches never read, which spanning removes (a cap from it said 1.66x at CPU size, 2.63x measured);
    ``doctor``'s short fits with and without spanning measure the effect."""
    outside = e.between_frac if e is not None else None
    if outside is None or not 0 < outside < 1:
        return None
    return 1 / (1 - outside)


def _between_advice(f: RunFacts, e: Evidence | None) -> list[str]:
    advice: list[str] = []
    share = "" if e is None or e.between_frac is None else f"{100 * e.between_frac:.0f} % of the run passes "
    lead = f"{share}outside the training steps (epoch ends, validation, checkpoints)"
    starts = e.epoch_start_frac if e is not None else None
    bound = (f" (the epochs' starts take {100 * starts:.0f} % of the run: expect up to {1 / (1 - starts):.2f}x "
             "the samples/s)" if starts is not None and 0 < starts < 1 else "")  # fmt: skip
    can_span = bool(f.num_workers) and not f.spans_epochs and "span_epochs" not in f.chosen_by
    # the epochs' starts go only where the workers load across epoch ends: a DataLoader's workers, persistent or
    # not, start an epoch's batches once its iterator is made (persistent_workers=True alone measured 0.96x on the
    # H200 where the starts took 29 % of the run: benchmarks/results/diagnosis-2026-11-26-h200.json). Spanning
    # the training and validation loaders removes the epochs' ends and starts and the validation loaders' restarts
    # and unread batches: at most the time outside the steps (short_epochs at CPU size: 3.49x where that bound said
    # 4.2x and the epochs' starts alone 1.5x)
    outside = e.between_frac if e is not None else None
    span_first = can_span and outside is not None and 0 < outside < 1
    if span_first:
        advice.append(
            "keep the workers loading across epoch ends: SpanEpochs(min_restart_share=0) in the callbacks "
            "(GPUBoost() includes it at 5 %), or return SpanningLoader(DataLoader(...)) from train_dataloader() and "
            "val_dataloader() (lightning_gpu_boost.core.spanning); a DataLoader's workers, persistent or not, start an "
            "epoch's batches only once it begins, and a validation pass's workers load batches it never reads "
            f"(expect up to {span_bound(e):.2f}x the samples/s, with all of the time outside the steps gone but "
            "validation's own steps)"
        )
    if f.num_workers and f.persistent_workers is False:
        advice.append(
            f"persistent_workers=True keeps the {f.num_workers} train workers alive across epochs instead of starting "
            "them again at every epoch"
            + (" (it saves their start-up; each epoch's first batches are still loaded once it begins)"
               if span_first else bound)  # fmt: skip
        )
    restart = [w for w, persistent in f.val_loaders if w > 0 and not persistent]
    if restart:
        advice.append("persistent_workers=True on the validation loader too (its workers restart every validation)")
    if e is not None and e.validation_frac is not None and e.validation_frac >= BETWEEN_STEPS_SHARE / 2:
        advice.append(
            f"validation takes {100 * e.validation_frac:.0f} % of the run: validate less often "
            "(Trainer(check_val_every_n_epoch=N) or val_check_interval) or on fewer batches (limit_val_batches)"
        )
    if f.batches_per_epoch is not None and f.batches_per_epoch < 50:
        advice.append(
            f"epochs of {f.batches_per_epoch} batches pay an epoch's start-up often: longer epochs (more samples per "
            "epoch, e.g. repeat the dataset) amortize it"
            + (
                ", or keep the workers loading across epoch ends: SpanEpochs(min_restart_share=0) in the callbacks "
                "(GPUBoost() includes it at 5 %), or return SpanningLoader(DataLoader(...)) from train_dataloader() "
                "and val_dataloader() (lightning_gpu_boost.core.spanning)"
                if can_span and not span_first
                else ""
            )
        )
    if not advice:
        advice.append(f"{lead}: check checkpoint frequency (ModelCheckpoint every_n_train_steps) and epoch-end hooks")
    else:
        advice[0] = f"{lead}: {advice[0]}"
    return advice


def format_advice(advice: list[str]) -> str:
    """``"Next: (1) ... (2) ..."``."""
    return "Next: " + " ".join(f"({i + 1}) {a}" for i, a in enumerate(advice))
