"""``diagnose``: where the training time goes, stage by stage, and what to change (the ``doctor`` command).

Lightning-bound (it times the model's step in a real Trainer), so it lives above the framework-free cores.

Measures the training loader alone (at its worker count and at the count ``AutoNumWorkers``' search picks, shared
through its cache), the host-to-GPU copy of one batch, and the model's training step on a batch already on the device (the ceiling:
what the step could do if data were free). The slowest stage is the bottleneck; the advice names the change and
the throughput to expect from it. Works on CPU (copy and GPU step are then not measured, and it says so).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch.utils.data import DataLoader

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.loader_rate import clone_loader, measure_batches_per_s
from lightning_gpu_boost.core.loaders import (
    AUTO_PERSISTENT_WORKERS,
    fixed_worker_count,
)
from lightning_gpu_boost.core.steady import (
    batch_size_of,
)
from lightning_gpu_boost.core.streaming.cache import CacheGrowth
from lightning_gpu_boost.core.streaming.source import remote_stream
from lightning_gpu_boost.core.verdicts import (
    BETWEEN_STEPS_SHARE,
    Evidence,
    RunFacts,
    Verdict,
    advise,
    batch_kind,
    downloading,
    fetches_batches,
    sample_cost_fixes,
)
from lightning_gpu_boost.core.worker_cpu import WorkerCPU
from lightning_gpu_boost.core.workers_cache import agreed_probe
from lightning_gpu_boost.doctor.measure import (
    NO_VALIDATION_WARNING,
    SHORT_EPOCH_WAVES,
    UTIL_MAX_S,
    UTIL_WINDOW_PERIODS,
    UTIL_WINDOW_S,
    measure_copy_ms,
    measure_epochs_fit,
    measure_fit,
    measure_step,
    measure_step_ms,
    measure_validation_s,
    queue_bound,
    short_epochs,
    trial_fit,
)

__all__ = ['Bottleneck', 'Diagnosis', 'HOST_BOUND_UTIL', 'NO_VALIDATION_WARNING', 'SERIAL_WAIT_SHARE', 'SHORT_EPOCH_WAVES', 'UTIL_MAX_S', 'UTIL_WINDOW_PERIODS', 'UTIL_WINDOW_S', 'VERDICT_OF', 'diagnose', 'measure_copy_ms', 'measure_epochs_fit', 'measure_fit', 'measure_step', 'queue_bound', 'measure_step_ms', 'measure_validation_s', 'short_epochs', 'trial_fit']

Bottleneck = Literal["loader", "remote", "copy", "host", "epoch-start", "compute", "unknown"]

#: each bottleneck's name in the taxonomy the watchdog shares (:mod:`~lightning_gpu_boost.core.verdicts`)
VERDICT_OF: dict[str, Verdict | None] = {"loader": "data-bound", "remote": "remote-io-bound", "copy": "copy-bound",
                                         "host": "host-bound",
                                         "epoch-start": "between-steps", "compute": "ok", "unknown": None}  # fmt: skip
#: the step on a resident batch is host-bound where the GPU is busy less than this share of it (%)
HOST_BOUND_UTIL = 80.0
#: without workers, loading is the bottleneck where it takes at least this share of each step's time (as the
#: watchdog's default ``wait_threshold``)
SERIAL_WAIT_SHARE = 0.2
#: a short fit at the current worker count ran at the loader's pace where it made less than this share of what the
#: step and the copy allow (the step on a resident batch plus one batch's copy)
LOADER_PACE_SHARE = 0.8


@dataclass
class Diagnosis:
    """What :func:`diagnose` measured (rates in samples/s, times in ms per batch) and concluded."""

    device: str
    batch_size: int
    num_workers: int | None
    loader_samples_per_s: float
    tuned_workers: int | None = None
    tuned_samples_per_s: float | None = None
    copy_ms: float | None = None
    step_ms: float | None = None
    #: the GPU's utilization (%) during the step on a resident batch (NVML; ``None`` where not sampled)
    step_gpu_util: float | None = None
    #: seconds from a fresh iterator to its first batch: what each epoch start costs without persistent workers
    startup_s: float | None = None
    batches_per_epoch: int | None = None
    persistent_workers: bool | None = None
    #: seconds the validation loader takes per epoch (a fresh pass over the batches validation reads), where given
    val_s: float | None = None
    #: the share of an epoch its start-up and its validation take (against the epoch's steps), where they are paid
    between_frac: float | None = None
    #: what a batch holds (:func:`~lightning_gpu_boost.core.verdicts.batch_kind`): it decides the advice
    batch_kind: str | None = None
    #: the loader fetches whole batches at once (:func:`~lightning_gpu_boost.core.verdicts.fetches_batches`)
    batched_fetch: bool = False
    #: the loader's dataset is a torchvision pipeline the GPU decode takes over (``GPUBoost()``'s ``decode="auto"``)
    decode_takes: bool = False
    #: samples/s of short fits of the model with the real loader, as training sees it (steady state), by worker count:
    #: the current count and the advised one (``trials=True``, a model, and a worker count to advise)
    fit_samples_per_s: dict[int, float] = field(default_factory=dict)
    #: how each of those fits was timed, by worker count: ``"steps"`` (a steady window of steps) or ``"whole
    #: epochs"`` (where an epoch is short, :func:`short_epochs`: each epoch's start is in the figure, as the run pays it)
    fit_timed: dict[int, str] = field(default_factory=dict)
    #: samples/s of short fits over whole epochs (validation included) as the project runs and with its workers kept
    #: loading across epoch ends (``SpanEpochs(min_restart_share=0)``): ``{"plain": ..., "spanned": ...}``, where
    #: the advice is to span the epochs (``trials=True``, a model)
    span_fit_samples_per_s: dict[str, float] = field(default_factory=dict)
    #: the train loader streams from object storage (:func:`~lightning_gpu_boost.core.streaming.source.remote_stream`)
    stream: dict[str, Any] | None = None
    #: while the loader alone was measured: its workers' share of time on a CPU, and bytes/s arriving in the
    #: stream's cache (``None`` where not read)
    workers_busy: float | None = None
    download_bytes_s: float | None = None
    bottleneck: Bottleneck = "unknown"
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict | None:
        """The bottleneck as a verdict of :mod:`~lightning_gpu_boost.core.verdicts` (``None`` where unknown)."""
        return VERDICT_OF[self.bottleneck]

    @property
    def ceiling_samples_per_s(self) -> float | None:
        return None if not self.step_ms else 1000 * self.batch_size / self.step_ms

    @property
    def loader_in_training_samples_per_s(self) -> float | None:
        """What the loader delivers in training at its current count: the short fit's rate there, where that fit
        made less than :data:`LOADER_PACE_SHARE` of what the step and the copy allow (the loader set its pace). It
        is taken in training's conditions (the pinning thread, a busy training process, the page cache as training
        leaves it), which the loader alone is not: on the H200 the ``segmentation`` workload's loader alone read
        6.1-7.2 samples/s where its fits made 9.0-11.7, and the short fit read 9.0 (the plain fits' median 9.6).
        ``None`` without such a fit."""
        fit = self.fit_samples_per_s.get(self.num_workers) if self.num_workers is not None else None
        if not fit or not self.step_ms:
            return None
        allowed = 1000 * self.batch_size / (self.step_ms + (self.copy_ms or 0.0))
        return fit if fit < LOADER_PACE_SHARE * allowed else None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ceiling_samples_per_s": self.ceiling_samples_per_s, "verdict": self.verdict,
                "loader_in_training_samples_per_s": self.loader_in_training_samples_per_s}  # fmt: skip

    def format(self) -> str:
        def rate(value: float | None) -> str:
            return "not measured" if value is None else f"{value:,.0f} samples/s"

        workers = "" if self.num_workers is None else f" at num_workers={self.num_workers}"
        lines = [f"lightning-gpu-boost doctor ({self.device}, batch {self.batch_size})",
                 f"  loader alone{workers}: {rate(self.loader_samples_per_s)}"]  # fmt: skip
        if self.tuned_workers is not None and self.tuned_workers != self.num_workers:
            lines.append(
                f"  loader alone at num_workers={self.tuned_workers}: {rate(self.tuned_samples_per_s)}"
            )
        lines.append(
            "  host->GPU copy: "
            + ("not measured" if self.copy_ms is None else f"{self.copy_ms:.2f} ms per batch")
        )
        step = "not measured" if self.step_ms is None else f"{self.step_ms:.1f} ms per batch"
        util = "" if self.step_gpu_util is None else f", GPU {self.step_gpu_util:.0f} % busy"
        lines.append(f"  training step on a resident batch: {step} ({rate(self.ceiling_samples_per_s)}{util})")
        if self.startup_s is not None:
            restart = (f"; {100 * self.between_frac:.0f} % of each epoch outside the steps (start-up"
                       + (f", validation {self.val_s:.1f} s" if self.val_s is not None else "") + ")"
                       if self.between_frac is not None else "")  # fmt: skip
            lines.append(f"  first batch of a fresh iterator: {self.startup_s:.2f} s{restart}")
        for w, r in sorted(self.fit_samples_per_s.items()):
            how = ", over whole epochs" if self.fit_timed.get(w) == "whole epochs" else ""
            lines.append(f"  training (a short fit of the model{how}) at num_workers={w}: {rate(r)}")
        in_training = self.loader_in_training_samples_per_s
        if in_training is not None:
            lines.append(f"  loader in training at num_workers={self.num_workers}: {rate(in_training)} (its short fit "
                         "ran at the loader's pace, below what the step and the copy allow)")  # fmt: skip
        for case, r in self.span_fit_samples_per_s.items():
            lines.append(f"  training over whole epochs, {case}: {rate(r)}")
        lines.append(f"Bottleneck: {self.bottleneck}" + (f" (verdict: {self.verdict})" if self.verdict else ""))
        lines += [f"  -> {a}" for a in self.advice] + [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def diagnose(
    datamodule: Any,
    model: Any = None,
    budget_s: float = 20.0,
    steps: int = 10,
    tune: bool = True,
    progress: Callable[[str], None] | None = None,
    val_loader: Any = None,
    val_batches: int | None = None,
    trials: bool = True,
    use_cache: bool = True,
    cache_path: str | None = None,
    **trainer_kwargs: Any,
) -> Diagnosis:
    """Measure ``datamodule``'s training loader, the copy of a batch and ``model``'s step, and name the bottleneck.

    Args:
        datamodule: a LightningDataModule (``prepare_data``/``setup("fit")`` are called) or a DataLoader.
        model: the LightningModule, or ``None`` to measure the data side only.
        budget_s: time for the loader measurements, ``> 0`` (the worker search, whose steady-state table gives
            the loader's rate at the current and the chosen worker count).
        steps: timed training steps for the ceiling.
        tune: also measure the loader at the worker count ``AutoNumWorkers``' search picks (``use_cache``).
        progress: called with a short line before each stage (the CLI prints them).
        val_loader: the validation DataLoader run every epoch, or ``None``: its pass over ``val_batches`` batches
            (all of them by default; Lightning's ``limit_val_batches`` as a count) is timed as each epoch pays it
            (a fresh iterator; with persistent workers, the second pass), and counts as time between steps.
        val_batches: batches validation reads per epoch, ``>= 1`` or ``None``.
        trials: where the advice is another worker count, also fit the model with the real loader at the current
            and at that count, as ``AutoNumWorkers()`` applies it (its workers kept between epochs; short fits timed
            in steady state, :func:`measure_fit`; over whole epochs, :func:`measure_epochs_fit`, where an epoch is
            short (:func:`short_epochs`), as the run will pay each epoch's start): the expected effect is then
            what training measured, not an estimate from the loader alone.
        use_cache: the worker search is ``AutoNumWorkers``' own (:func:`~lightning_gpu_boost.core.workers_cache.
            agreed_probe`), read from and written to its cache: the count this diagnosis advises, and whose effect its
            short fits measure, is the count ``AutoNumWorkers()`` then applies (a search of its own could land on
            another count within the loader's noise: segmentation on the H100, 12 here and 16 there). ``False``:
            searched again, not written.
        cache_path: that cache's file (default: ``AutoNumWorkers``' own, ``~/.cache/lightning_gpu_boost/``).
        **trainer_kwargs: Trainer arguments for the step (``precision="bf16-mixed"``, ``accelerator``...).

    Raises:
        ValueError: a non-positive ``budget_s`` or ``steps``.
    """
    if budget_s <= 0:
        raise ValueError(f"budget_s must be > 0 seconds, got {budget_s!r}.")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}.")
    checks.check_int("val_batches", val_batches, low=1, allow_none=True)
    say = progress or (lambda line: None)
    if isinstance(datamodule, DataLoader) or not hasattr(datamodule, "train_dataloader"):
        loader = datamodule
    else:
        datamodule.prepare_data()
        datamodule.setup("fit")
        # our DataModules' loaders as a Trainer gets them (uint8 images, normalized after the copy)
        as_in_a_trainer = getattr(datamodule, "loaders_as_in_a_trainer", contextlib.nullcontext)
        with as_in_a_trainer():
            loader = datamodule.train_dataloader()
    accelerator = trainer_kwargs.get("accelerator", "auto")
    cuda = torch.cuda.is_available() and accelerator in ("auto", "gpu", "cuda")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    started = time.perf_counter()
    first = next(iter(loader))
    startup_s = time.perf_counter() - started
    if isinstance(loader, DataLoader) and loader.num_workers > 0 and not loader.persistent_workers:
        # what every epoch pays again: the faster of two fresh starts (the first also pays one-time costs: page
        # faults of the fork, the first file reads, lazy imports in the workers)
        started = time.perf_counter()
        next(iter(loader))
        startup_s = min(startup_s, time.perf_counter() - started)
    batch_size = batch_size_of(first)
    if isinstance(loader, DataLoader):
        workers = loader.num_workers
        table: dict[int, float] = {}
        stream = remote_stream(loader.dataset)
        if tune and fixed_worker_count(loader) is not None:  # a stream's count is part of its resume state
            tune = False
            say(f"the loader keeps its own resume state: num_workers={workers} is not searched")
        if tune:
            say(f"searching the worker count, loader alone (budget {budget_s:.0f} s) ...")
            probe = agreed_probe(loader, budget_s=budget_s, use_cache=use_cache, cache_path=cache_path)
            if probe.cached:
                say(f"the worker count from AutoNumWorkers' cache (this loader was searched before): "
                    f"num_workers={probe.num_workers}")  # fmt: skip
            # the probe's steady-state rates (batches/s at the loader's batch size) in samples/s
            table = {w: r * batch_size for w, r in probe.table.items()}
        # a remote stream (never tuned: measured here): were its workers busy, did its cache grow, while measured
        meters = (WorkerCPU(), CacheGrowth(stream["cache_dir"])) if stream and stream["cache_dir"] else None
        if workers not in table:
            say(f"measuring the loader alone at num_workers={workers} ...")
            clone = clone_loader(loader, workers)
            if meters is not None:  # both count from here
                meters[0].busy_share(workers)
                meters[1].bytes_per_s()
            rate = measure_batches_per_s(clone, workers, budget_s / 2, min(2.0, budget_s / 4))
            table[workers] = rate * batch_size
        result = Diagnosis(str(device), batch_size, workers, table[workers], stream=stream)
        if meters is not None:
            result.workers_busy, result.download_bytes_s = meters[0].busy_share(workers), meters[1].bytes_per_s()
        if tune:
            result.tuned_workers = probe.num_workers
            result.tuned_samples_per_s = table.get(probe.num_workers)
    else:  # DALI or another iterable: time it as it is
        say("measuring the loader alone ...")
        it, n, start = iter(loader), 0, time.perf_counter()
        while time.perf_counter() - start < budget_s / 4:
            try:
                next(it)
            except StopIteration:
                it = iter(loader)
            n += 1
        result = Diagnosis(str(device), batch_size, None, n * batch_size / (time.perf_counter() - start))

    if cuda:
        say("timing the host->GPU copy of one batch ...")
        result.copy_ms = measure_copy_ms(first, device)
    else:
        result.notes.append(
            "no CUDA device: the host->GPU copy is not measured and the step runs on the CPU."
        )
    result.startup_s = startup_s
    result.batch_kind = batch_kind(first)
    result.batched_fetch = fetches_batches(loader)
    from lightning_gpu_boost.core.gpu_decode import recognize

    result.decode_takes = recognize(getattr(loader, "dataset", None)) is not None
    if isinstance(loader, DataLoader):
        result.persistent_workers = bool(loader.persistent_workers)
        try:
            result.batches_per_epoch = len(loader)
        except TypeError:
            result.batches_per_epoch = None
    if val_loader is not None:
        say("timing a validation pass ...")
        result.val_s = measure_validation_s(val_loader, val_batches, cap_s=budget_s / 2)
    if model is not None:
        say(f"timing {steps} training steps on a batch already on {device} ...")
        result.step_ms, result.step_gpu_util = measure_step(model, first, steps=steps, **trainer_kwargs)
    else:
        result.notes.append("no model given (--model): the training step, the ceiling, is not measured.")
    advised = result.tuned_workers
    if trials and model is not None and isinstance(loader, DataLoader) and advised not in (None, loader.num_workers):
        fit_steps = max(2 * steps, 32)
        for count in (loader.num_workers, advised):
            say(f"a short fit of the model with the loader at num_workers={count} ...")
            fit = trial_fit(model, loader, count, fit_steps, **trainer_kwargs)
            result.fit_samples_per_s[count] = fit["samples_per_s"]
            result.fit_timed[count] = fit["measured"]
    _conclude(result)
    if trials and model is not None and isinstance(loader, DataLoader) and result.bottleneck == "epoch-start":
        _span_trials(result, model, loader, max(2 * steps, 32), val_loader, val_batches, say, trainer_kwargs)
    return result


def _span_trials(result: Diagnosis, model: Any, loader: DataLoader, steps: int, val_loader: Any,
                 val_batches: int | None, say: Callable[[str], None], trainer_kwargs: dict[str, Any]) -> None:  # fmt: skip
    """Short fits over whole epochs, validation included, as the project runs and with
    ``SpanEpochs(min_restart_share=0)``: the effect of the advice to span the epochs, measured the way training
    sees it (the time outside the steps is only a bound: spanned, the workers may set the pace), quoted in it."""
    from lightning_gpu_boost.callbacks import SpanEpochs

    fits = {}
    for case, callbacks in (("plain", ()), ("spanned", (SpanEpochs(min_restart_share=0),))):
        say(f"a short fit over whole epochs, {case} ...")
        fits[case] = measure_epochs_fit(model, loader, steps=steps, callbacks=callbacks, val_loader=val_loader,
                                        val_batches=val_batches, **trainer_kwargs)["samples_per_s"]  # fmt: skip
    result.span_fit_samples_per_s = fits
    now, then = fits["plain"], fits["spanned"]
    for i, advice in enumerate(result.advice):
        if "SpanEpochs(min_restart_share=0)" in advice:
            result.advice[i] = advice.rstrip(".") + (f"; short fits over whole epochs measured {now:,.0f} -> "
                                                      f"{then:,.0f} samples/s ({then / now:.2f}x) with it.")  # fmt: skip
            break


def _evidence(d: Diagnosis) -> Evidence:
    """What the loader's measurement says of where it waits (the workers' CPU share, the stream's downloads)."""
    load_s = d.batch_size / d.loader_samples_per_s if d.loader_samples_per_s > 0 else float("inf")
    step_s = (d.step_ms or 0.0) / 1000
    return Evidence(load_s / (load_s + step_s) if math.isfinite(load_s) else 1.0, d.step_ms or 0.0,
                    workers_busy=d.workers_busy, download_bytes_s=d.download_bytes_s)  # fmt: skip


def _join_fixes(d: Diagnosis) -> str:
    """The sample-cost fixes for what ``d``'s batches hold (the watchdog's wording), as one clause."""
    facts = RunFacts(cuda=d.device.startswith("cuda"), num_workers=d.num_workers, batch_size=d.batch_size,
                     batch_kind=d.batch_kind, batched_fetch=d.batched_fetch, decode_takes=d.decode_takes)  # fmt: skip
    return "; ".join(sample_cost_fixes(facts))


def _advised(d: Diagnosis) -> str:
    """The advised count as the short fit at it ran it, as ``AutoNumWorkers()`` applies it: ``"num_workers=N"``,
    with ``", persistent_workers=True"`` where the loader's workers are not kept between epochs (the fit kept them:
    AutoNumWorkers' default)."""
    keep = AUTO_PERSISTENT_WORKERS and d.tuned_workers and not d.persistent_workers and d.tuned_workers in (
        d.fit_samples_per_s)
    return f"num_workers={d.tuned_workers}" + (", persistent_workers=True" if keep else "")


#: an advised worker count's short fit must beat the current count's by this factor (the fits' own spread is a few
#: per cent): below it the count is not advised, and a note says what the fits measured
FIT_GAIN_MIN = 1.05


def _fits_gain(d: Diagnosis) -> float | None:
    """The tuned count's short fit over the current count's, where both ran."""
    fits = d.fit_samples_per_s
    if d.tuned_workers not in fits or d.num_workers not in fits or fits[d.num_workers] <= 0:
        return None
    return fits[d.tuned_workers] / fits[d.num_workers]


def _not_advised(d: Diagnosis, loader: float, tuned: float) -> str:
    """The note for a worker count that loads faster alone but whose short fit was no faster."""
    now, then = d.fit_samples_per_s[d.num_workers], d.fit_samples_per_s[d.tuned_workers]
    return (f"num_workers={d.tuned_workers} loads faster alone ({loader:,.0f} -> {tuned:,.0f} samples/s), but short "
            f"fits of the model measured {now:,.0f} -> {then:,.0f} samples/s: not advised.")  # fmt: skip


def _measured(d: Diagnosis) -> str:
    """``" (short fits of the model measured A -> B samples/s, Nx)"`` where both fits ran, else ``""``."""
    fits = d.fit_samples_per_s
    if d.tuned_workers not in fits or d.num_workers not in fits:
        return ""
    now, then = fits[d.num_workers], fits[d.tuned_workers]
    return f" (short fits of the model measured {now:,.0f} -> {then:,.0f} samples/s, {then / now:.2f}x)"


def _conclude(d: Diagnosis) -> None:
    loader = d.loader_samples_per_s
    tuned = d.tuned_samples_per_s or loader
    if d.step_ms is None:
        d.bottleneck = "unknown"
        d.advice.append(f"the loader alone delivers {loader:,.0f} samples/s; measure the step to compare.")
        return
    step_s, copy_s = d.step_ms / 1000, (d.copy_ms or 0.0) / 1000
    ceiling = d.batch_size / step_s
    with_copy = d.batch_size / (step_s + copy_s)  # Lightning copies on the compute stream, before the step
    restarts = bool(d.num_workers) and d.persistent_workers is False and d.startup_s is not None
    serial = d.num_workers == 0 and loader > 0  # no workers: loading and the step take turns
    load_s = d.batch_size / loader if loader > 0 else float("inf")
    if (restarts or d.val_s is not None) and d.batches_per_epoch and loader > 0:
        # every epoch starts its workers again: what a fresh iterator's first batch costs beyond one worker making
        # one batch (which persistent workers pay too) is the start-up; the steps run at the slower pace; each
        # epoch's validation pass is time between steps too
        spawn_s = max(0.0, d.startup_s - load_s * (d.num_workers or 1)) if restarts else 0.0
        outside = spawn_s + (d.val_s or 0.0)
        epoch_s = d.batches_per_epoch * max(step_s + copy_s, load_s)
        d.between_frac = outside / (outside + epoch_s)
    if d.between_frac is not None and d.between_frac >= BETWEEN_STEPS_SHARE:
        d.bottleneck = "epoch-start"
        val = (f" and validation loads for {d.val_s:.1f} s" if d.val_s else "")
        start = (f"starts {d.num_workers} worker{'s' if d.num_workers != 1 else ''} again and waits {d.startup_s:.1f} s for its first batch"
                 if restarts else "keeps its workers")  # fmt: skip
        d.advice.append(
            f"each epoch of {d.batches_per_epoch} batches {start}{val}: {100 * d.between_frac:.0f} % of the epoch "
            "passes outside the steps. Keep the workers loading across epoch ends: SpanEpochs(min_restart_share=0) in "
            "the callbacks (GPUBoost() includes it at 5 %; it also gives validation a loader over the batches it "
            "reads), since a DataLoader's workers, persistent or not, start an epoch's batches only once it begins; "
            "else set persistent_workers=True on the training and validation DataLoaders (it saves their start-up), "
            "make epochs longer (more samples per epoch) and validate less often (check_val_every_n_epoch)."
        )
    elif serial and load_s >= SERIAL_WAIT_SHARE * (load_s + step_s + copy_s):
        d.bottleneck = "loader"
        share = load_s / (load_s + step_s + copy_s)
        gain = _fits_gain(d)
        if not d.tuned_workers:
            workers = "add AutoNumWorkers() to the Trainer's callbacks to load while the step runs; and make"
        elif gain is None or gain > FIT_GAIN_MIN:
            workers = f"set {_advised(d)} (or add AutoNumWorkers()) to load while the step runs{_measured(d)}; and make"
        else:  # the fits measured no gain: the count is not advised, as for a loader with workers (below)
            workers = "Make"
            d.notes.append(_not_advised(d, loader, tuned))
        d.advice.append(
            f"num_workers=0 loads each batch in the training process, between the steps: {1000 * load_s:.1f} ms of "
            f"every {1000 * (load_s + step_s + copy_s):.1f} ms ({100 * share:.0f} %). {workers} each sample cheaper: "
            + _join_fixes(d) + "."
        )  # fmt: skip
    elif loader < 0.9 * with_copy and d.stream is not None and downloading(_evidence(d)):
        d.bottleneck = "remote"  # the workers sat idle while the stream's cache grew: the wait is on downloads
        facts = RunFacts(cuda=d.device.startswith("cuda"), num_workers=d.num_workers, usable_cpus=usable_cpus(),
                         batch_size=d.batch_size, remote_stream=d.stream)  # fmt: skip
        d.advice += advise("remote-io-bound", facts, _evidence(d))
        d.notes.append(f"the loader alone ({loader:,.0f} samples/s) is below what the step can take "
                       f"({with_copy:,.0f}); a warm cache (a later epoch) reads locally and may not wait.")  # fmt: skip
    elif loader < 0.9 * with_copy:
        d.bottleneck = "loader"
        expected = min(tuned, with_copy)
        gain = _fits_gain(d)
        if gain is not None:  # measured the way training sees it
            if gain > FIT_GAIN_MIN:
                now, then = d.fit_samples_per_s[d.num_workers], d.fit_samples_per_s[d.tuned_workers]
                d.advice.append(
                    f"set {_advised(d)} (or add AutoNumWorkers() to the Trainer's callbacks): short fits "
                    f"of the model measured {now:,.0f} -> {then:,.0f} samples/s ({gain:.2f}x)."
                )
            else:
                d.notes.append(_not_advised(d, loader, tuned))
        elif d.tuned_workers is not None and tuned > 1.1 * loader:
            d.advice.append(
                f"set num_workers={d.tuned_workers} (or add AutoNumWorkers() to the Trainer's callbacks): the loader "
                f"goes from {loader:,.0f} to {tuned:,.0f} samples/s; expect about {expected:,.0f} samples/s "
                f"({expected / loader:.1f}x)."
            )
        if tuned < 0.9 * with_copy:
            d.advice.append(
                ("even at its best worker count" if d.tuned_workers is not None else f"at num_workers={d.num_workers}")
                + f" the loader ({tuned:,.0f} samples/s) is below what the step can take ({with_copy:,.0f}): make "
                "each sample cheaper: " + _join_fixes(d) + "."
            )
    elif copy_s > 0.15 * step_s:
        d.bottleneck = "copy"
        d.advice.append(
            f"the copy takes {d.copy_ms:.1f} ms of each {d.step_ms + d.copy_ms:.1f} ms step: StreamPrefetch() copies "
            f"the next batch on a side stream while this one computes; expect about "
            f"{min(loader, ceiling):,.0f} samples/s ({min(loader, ceiling) / with_copy:.2f}x). Shipping uint8 images "
            "and normalizing on the GPU (StreamPrefetch(normalize=...)) copies 4x fewer bytes."
        )
    elif d.step_gpu_util is not None and d.step_gpu_util < HOST_BOUND_UTIL:
        d.bottleneck = "host"
        d.advice.append(
            f"the step idles the GPU ({d.step_gpu_util:.0f} % utilization on a batch already on it, "
            f"{d.step_ms:.1f} ms per step): data is not the limit. Remove per-step synchronizations (.item(), .cpu(), "
            ".tolist(), printing tensors; log tensors with self.log) and Python work between kernels; "
            "torch.compile(model) cuts launch overhead."
        )
    else:
        d.bottleneck = "compute"
        d.advice.append(
            f"the step itself is the limit ({d.step_ms:.1f} ms per batch, {ceiling:,.0f} samples/s; the loader "
            f"delivers {loader:,.0f}): use mixed precision (precision=recommended_precision()), "
            + ("channels_last for convolutional models (GPUBoost), " if d.batch_kind in ("images", "images+masks", None)
               else "torch.compile(model), ")
            + "or a larger batch if memory allows."
        )  # fmt: skip
    if not math.isfinite(loader):
        d.notes.append("the loader measurement did not finish: raise --budget.")
