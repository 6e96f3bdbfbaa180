"""Run the workloads: the watchdog's verdict on each plain project, and on a GPU ``GPUBoost()`` as the only change
and the ceiling (its first batch resident on the GPU; for a project timed over whole epochs, its epochs and
validation with each loader's first batch resident, timed the same way), every case in one run.

    python benchmarks/workloads --size cpu --out /tmp       # seconds per workload (what CI checks)
    python benchmarks/workloads --data /tmp/workloads       # H100 machine: --size gpu by default there

Bars (issue 17; ``workloads-<date>-<machine>.json``): ``verdicts_right`` (the plain run's verdict equals the one
written in the workload before it ran, every workload); on a GPU also ``starvation_warnings_fed`` (none on
``tokens_lm`` and ``host_bound``), ``gpu_boost_vs_plain_min`` >= 0.98 (medians of ``ROUNDS`` interleaved rounds
where a workload sets it: host_bound's step varies about 10 % between runs), ``gpu_boost_vs_plain_min_data_bound`` >= 3,
``gpu_boost_of_ceiling_min_data_bound`` >= 0.90 (the issue's bar is for each workload's documented best; GPUBoost()
alone is what is measured so far; ``best_of_ceiling`` compares the medians of ``BEST_ROUNDS`` interleaved ceiling and
best fits where a workload sets it) and ``steady_state_halves_max_diff`` <= 0.05.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the workloads import each other by module name, as scripts in one folder do
sys.path.insert(1, str(HERE.parent.parent))  # the repository, for the harness's own imports

import lightning.pytorch as pl  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from lightning.fabric.utilities.apply_func import move_data_to_device  # noqa: E402

from lightning_gpu_boost.callbacks import GPUBoost, GPUUtilWatchdog  # noqa: E402
from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter  # noqa: E402
from lightning_gpu_boost.core.loaders import spanned_loaders  # noqa: E402
from lightning_gpu_boost.core.results import bar, write_result  # noqa: E402
from lightning_gpu_boost.core.run_record import run_record  # noqa: E402
from lightning_gpu_boost.core.steady import (  # noqa: E402
    ResidentBatches,
    batch_size_of,
    whole_epoch_rates,
    worst_halves_diff,
)

sys.path.insert(2, str(HERE.parent))  # benchmarks/, for what its scripts share
from _common import carried_over  # noqa: E402

#: what one workload's run measures (``--cases`` picks some of them)
CASES = ("plain", "doctor", "gpu_boost", "ceiling", "best")
#: timed steps per case on a GPU (after the loader's queue has drained)
TIMED_STEPS = 48
#: the expected verdicts that GPUBoost() is meant to fix (the data-bound bars)
DATA_BOUND = ("data-bound", "copy-bound", "between-steps")
#: on a GPU a case runs at least this many seconds after its window opens: the watchdog's verdicts need NVML
#: samples (each covers 1/6 s to 1 s), and short steps would end the fit before its first window closed
MIN_SECONDS = 3.0
#: a GPU case's step cap (the meter ends the fit before it): high enough that the fastest case, tabular's applied fit
#: at about 330 steps/s, times MIN_SECONDS and more before it
MAX_STEPS = 100 * TIMED_STEPS
#: the fewest timed steps a window ended by its epoch's end holds (the workers start again there: a window does not
#: run across the restart), else it is timed on across that end (or over whole epochs: ``Meter``)
MIN_EPOCH_WINDOW = 16
#: the most windows, one per epoch, tried for a steady one; then the steadiest is taken (``epoch_windows``)
EPOCH_WINDOWS = 3
#: the fewest waves (one batch from each worker) a window ended by its epoch's end holds
EPOCH_WAVES = 4
#: whole epochs timed (at least) where a loader with workers has no steady window in one epoch
WHOLE_EPOCHS = 2
#: and at most
MAX_WHOLE_EPOCHS = 4


class Meter(ThroughputMeter):
    """The ThroughputMeter that ends the fit only after :data:`MIN_SECONDS` of timed steps, then once the window's
    halves agree (checked every 8 steps), or once both three times :data:`MIN_SECONDS` and three times its steps are
    timed (slow steps get as many steps as fast ones to settle, fast ones as many seconds).

    A window ends at its epoch's end (not through a ``SpanningLoader``: the next epoch starts its workers and fills
    its queue again, which is not the steady state). There the fit ends if the window is steady; otherwise the window
    is kept and a fresh one opens in the next epoch, after its warm-up and queue, up to :data:`EPOCH_WINDOWS`
    windows; the summary is the steadiest window's, with ``epoch_windows`` (how many were taken).

    Where the loader has workers and an epoch is too short to hold a window of its own (fewer than
    :data:`MIN_EPOCH_WINDOW` timed steps, :data:`EPOCH_WAVES` waves of one batch per worker, or :data:`MIN_SECONDS`),
    whole epochs are timed from the next one on, their starts included, as ``doctor``'s short fits time such a
    loader (``short_epochs``): workers, persistent or not, load an epoch's batches only once it begins (and start
    again where not persistent). ``segmentation``'s AutoNumWorkers run on the H200 (16 workers, 64-batch epochs) gets
    each epoch in four waves of 16 batches, and a window after the 33-batch queue held two of them (halves 21 %
    apart; over whole epochs 2.6 %). The fit ends once :data:`WHOLE_EPOCHS` epochs and :data:`MIN_SECONDS` are
    timed with agreeing halves (the first and last half of the epochs), or :data:`MAX_WHOLE_EPOCHS` epochs. A change
    one of our parts made in training (the run record's ``changes``: AutoNumWorkers deciding its count again, from
    the next epoch) starts the timed epochs again from the next epoch. Short epochs without workers are timed across
    their ends, as before."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        loader = getattr(trainer, "train_dataloader", None)
        self._spans = bool(spanned_loaders(loader))
        self._kept: list[dict[str, Any]] = []
        #: whole-epoch timing: each epoch's end (the first: the training's start) and samples; the first timed epoch
        self._ends: list[float] = [time.monotonic()]
        self._epoch_samples: list[float] = [0.0]
        self._epoch_steps: list[int] = [0]
        self._whole_from: int | None = None
        self._changes = 0
        self._cuda = pl_module.device if pl_module.device.type == "cuda" else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._epoch_samples[-1] += float(batch_size_of(batch))
        self._epoch_steps[-1] += 1
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def _may_stop(self, trainer: pl.Trainer, batch_idx: int, timed: int) -> bool:
        if self._whole_from is not None:
            return False  # whole epochs: judged at their ends
        elapsed = time.monotonic() - self._stamps[self.opened_at]
        if elapsed < MIN_SECONDS:
            return False
        if elapsed >= 3 * MIN_SECONDS and timed >= 3 * self.timed_steps:
            return True
        if batch_idx + 1 >= trainer.num_training_batches and not self._spans:
            return self._epoch_ends(trainer)
        if timed % 8:
            return False
        self._window = None
        return self.window().steady

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._cuda is not None:
            torch.cuda.synchronize(self._cuda)
        self._ends.append(time.monotonic())
        self._epoch_samples.append(0.0)
        self._epoch_steps.append(0)
        changes = len(run_record(trainer).changes)
        if changes != self._changes and self._whole_from is not None:
            self._whole_from = len(self._ends) - 1  # a part changed the loader: time from the next epoch
        self._changes = changes
        if not self.timed_steps or self._spans or trainer.should_stop:
            return
        if self._whole_from is not None:
            whole = self.whole_epochs()
            if whole["epochs_timed"] >= MAX_WHOLE_EPOCHS or (
                whole["epochs_timed"] >= WHOLE_EPOCHS and whole["window_s"] >= MIN_SECONDS and whole["steady"]
            ):
                trainer.should_stop = True
        # an epoch that ended before its window held its steps (`_may_stop` decided at the others' last step)
        elif self._stamps and self._epoch_ends(trainer):
            trainer.should_stop = True

    def _epoch_ends(self, trainer: pl.Trainer) -> bool:
        """At an epoch's end: stop where the window is steady (or :data:`EPOCH_WINDOWS` epochs were tried), else
        keep it and start a fresh one in the next epoch, or time whole epochs from the next one on (a loader with
        workers whose epoch is too short for a window)."""
        self._window = None
        window = self.window()
        workers = getattr(getattr(trainer, "train_dataloader", None), "num_workers", 0) or 0
        # a window holds EPOCH_WAVES waves (a batch from each worker) at least: workers started together deliver
        # their batches in waves, and halves of fewer waves differ by where the waves fall
        short = window.timed < max(MIN_EPOCH_WINDOW, EPOCH_WAVES * workers) or window.seconds < MIN_SECONDS
        if not short and window.steady:
            return True
        if short and workers:  # whole epochs from the next one (``_ends[e]``: epoch e's start)
            self._whole_from = trainer.current_epoch + 1
            self._reset_window()
            return False
        if short:
            return False  # an epoch too short to hold a window of its own: timed on across its end, as before
        self._kept.append(super().summary())
        if len(self._kept) >= EPOCH_WINDOWS:
            return True
        self._reset_window()
        return False

    def _reset_window(self) -> None:
        self._stamps, self._samples, self._waits, self._cpu = [], [0.0], [0.0], []  # the next epoch's window
        self._window, self.opened_at = None, None

    def whole_epochs(self) -> dict[str, Any]:
        """Samples per second over the whole epochs timed so far (their starts and any validation included)."""
        first = self._whole_from or 0
        return {**whole_epoch_rates(self._ends[first:], self._epoch_samples[first:-1]),
                "steps": sum(self._epoch_steps[first:-1])}  # fmt: skip

    def summary(self) -> dict[str, Any]:
        if self._whole_from is not None and len(self._ends) - 1 > self._whole_from:
            whole = self.whole_epochs()
            return {**whole, "epoch_windows": len(self._kept)}
        now = super().summary()
        windows = [*self._kept, *([now] if now["steps"] else [])] or [now]
        best = min(windows, key=lambda w: (not w["steady"], w["halves_diff"] if w["halves_diff"] == w["halves_diff"]
                                            else float("inf"), -w["steps"]))  # fmt: skip
        return {**best, "epoch_windows": len(windows)}


class EpochClock(pl.Callback):
    """Samples per second over whole epochs, validation and epoch ends included: the figure for a project whose
    epochs are a few batches long (``max_epochs``, no ``max_steps``), where a window of steps would leave out what
    matters. The first ``WARMUP`` epochs are warm-up (workers' first start, cuDNN autotuning, a loader's queue that
    spans epochs filling up); the halves are the first and the last half of the timed epochs. On a GPU the fit ends
    once at least two epochs are timed over at least ``MIN_EPOCH_SECONDS`` and their halves agree (the project's
    ``max_epochs`` is the cap, and ``MAX_EPOCH_SECONDS`` of timed epochs): a slow epoch is timed twice, a fast one
    as often as that takes."""

    WARMUP = 2
    MIN_EPOCH_SECONDS = 10.0
    MAX_EPOCH_SECONDS = 150.0

    def __init__(self, stop_when_steady: bool = False) -> None:
        self.starts: list[float] = []
        self.samples: list[float] = []
        self.end = 0.0
        self.stop_when_steady = stop_when_steady

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.starts.append(time.monotonic())
        self.samples.append(0.0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.samples[-1] += batch_size_of(batch)

    def on_train_epoch_end(self, trainer, pl_module) -> None:  # after the epoch's validation
        if not self.stop_when_steady or len(self.starts) - self.WARMUP < 2:
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self.end = time.monotonic()
        summary = self.summary()
        window = summary["window_s"]
        if (window >= self.MIN_EPOCH_SECONDS and summary["steady"]) or window >= self.MAX_EPOCH_SECONDS:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self.end = time.monotonic()

    def summary(self) -> dict[str, Any]:
        w = min(self.WARMUP, max(len(self.starts) - 2, 0))  # at least two timed epochs where there are three
        # epoch e runs from starts[e] to starts[e + 1] (its validation included), the last to the end
        return {**whole_epoch_rates([*self.starts[w:], self.end], self.samples[w:]), "warmup_epochs": w}


def names() -> tuple[str, ...]:
    spec = importlib.util.spec_from_file_location("workloads_index", HERE / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.NAMES


def fit(name: str, size: str, data_root: Path, case: str = "plain", change: Any = None) -> dict[str, Any]:
    """One run of workload ``name``: ``case`` is ``"plain"`` (as its users run it), ``"gpu_boost"`` (plus
    ``GPUBoost()``), ``"best"`` (the documented fix, for the data-bound ones: ``_best.BEST``) or ``"ceiling"`` (its
    first batch resident on the device, GPUBoost's step). ``change``: ``(model, train, val, kwargs) -> (model, train,
    val, kwargs, callbacks)``, one change applied to the plain project (``benchmarks/diagnosis.py``'s advice)."""
    module = importlib.import_module(name)
    data = module.prepare(Path(data_root), size)
    extra: list[pl.Callback] = []
    if case == "best":  # the documented fix (benchmarks/workloads/_best.py)
        from _best import BEST

        model, train, val, kwargs, extra = BEST[name](data, size)
    else:
        model, train, val, kwargs = module.build(data, size)
    if change is not None:
        model, train, val, kwargs, extra = change(model, train, val, kwargs)
    gpu = size == "gpu" and torch.cuda.is_available()
    small = size == "cpu"
    if small:  # one core steps, as one core drives a GPU; the others are the workers' (CI has two)
        torch.set_num_threads(1)
    # 6-step windows at CPU size: in a 4-step window of tokens_lm's ~50 ms steps, one batch 40 ms late (the CI
    # machine's other test busy on both CPUs) flagged a window of an "ok" run as data-bound once
    dog = GPUUtilWatchdog(window=6 if small else 10, warmup_steps=3 if small else 10, on_starvation="ignore",
                          summary=False)  # fmt: skip
    # on a GPU the meter ends the fit once its window (after the loader's queue has drained) holds TIMED_STEPS
    # steps whose halves agree: the project's own max_steps would end most runs inside the queue's drain
    epochs = "max_epochs" in kwargs and "max_steps" not in kwargs  # short epochs: EpochClock (the ceiling too)
    meter = Meter(warmup=3 if small else 10, steps=TIMED_STEPS if gpu and not epochs else None, sample_gpu_util=False)
    clock = EpochClock(stop_when_steady=gpu) if epochs else None
    if gpu and not epochs:
        kwargs = {**kwargs, "max_steps": max(kwargs.get("max_steps", 0), MAX_STEPS)}
    callbacks: list[pl.Callback] = [dog, meter, *extra, *([clock] if clock else [])]
    if case == "gpu_boost":
        callbacks.append(GPUBoost())
    if case == "ceiling":
        # the same step as GPUBoost's (its TF32, cuDNN and channels_last settings), on one resident batch
        callbacks.append(GPUBoost(prefetch=False, auto_workers=False, watchdog=False))
        device = torch.device("cuda" if gpu else "cpu")
        if epochs:  # timed over whole epochs as the other cases are: the same epochs and validation, no loading
            limit = kwargs.get("limit_val_batches")
            val_batches = limit if isinstance(limit, int) and not isinstance(limit, bool) else len(val or [])
            train = ResidentBatches(move_data_to_device(next(iter(train)), device), len(train))
            val = ResidentBatches(move_data_to_device(next(iter(val)), device), val_batches) if val else None
        else:
            steps = kwargs.get("max_steps", 40)
            train, val = ResidentBatches(move_data_to_device(next(iter(train)), device), steps), None
            kwargs = {"max_steps": steps, **{k: v for k, v in kwargs.items() if k == "precision"}}  # the same step
    datamodule = isinstance(train, pl.LightningDataModule)  # a best that reads through one (DALIDataModule)
    trainer = pl.Trainer(
        accelerator="gpu" if gpu else "cpu", devices=1, callbacks=callbacks, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        **({"limit_val_batches": 0} if val is None and not datamodule else {}), **kwargs,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the verdicts are recorded, not printed
        if datamodule:
            trainer.fit(model, datamodule=train)
        else:
            trainer.fit(model, train, val)
    for loader in (train, val):  # a loader with threads of its own (DALILoader): none left running beside the next fit
        if not datamodule and callable(getattr(loader, "close", None)):
            loader.close()
    del trainer, model, train, val
    gc.collect()  # the next fit forks workers: no earlier fit's pinned batches left for them to free
    return {
        "verdict": dog.run_verdict,
        "window_verdicts": [w["verdict"] for w in dog.warnings],
        "starvation_warnings": sum(w["verdict"] in ("data-bound", "copy-bound") for w in dog.warnings),
        "advice": dog.run_advice,
        "messages": [w["message"] for w in dog.warnings],
        "watchdog": dog.summaries[0] if dog.summaries else {},
        "throughput": clock.summary() if clock else meter.summary(),
        **({"step_window": meter.summary()} if clock else {}),
    }


def doctor(name: str, size: str, data_root: Path, tune: bool = False, trials: bool = False) -> dict[str, Any]:
    """``doctor``'s diagnosis of the plain project (its own loader and model, a fresh build): the verdict it names
    from measuring the loader alone, one batch's copy and the step on a resident batch; ``tune`` and ``trials``:
    also the worker count it would advise and short fits of the model at the current and that count."""
    from lightning_gpu_boost.doctor import diagnose

    module = importlib.import_module(name)
    model, train, val, kwargs = module.build(module.prepare(Path(data_root), size), size)
    limit = kwargs.get("limit_val_batches")
    val_batches = limit if isinstance(limit, int) and not isinstance(limit, bool) else None
    gpu = size == "gpu" and torch.cuda.is_available()
    threads = torch.get_num_threads()
    if size == "cpu":
        torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the project's precision, as a user passes it (`doctor --precision bf16-mixed`): without it the short
            # fits ran vit_finetune's step in fp32, compute-bound at ~1,190/s at both worker counts on the H100,
            # where the bf16 run was data-bound (its prediction 0.99x against 1.63x measured)
            precision = {k: v for k, v in kwargs.items() if k == "precision"}
            d = diagnose(train, model, budget_s=30.0 if gpu else 4.0, steps=10 if gpu else 5, tune=tune, trials=trials,
                         val_loader=val, val_batches=val_batches, accelerator="gpu" if gpu else "cpu",
                         **precision)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    del model, train, val
    gc.collect()
    return {"verdict": d.verdict, "bottleneck": d.bottleneck, "advice": d.advice, "diagnosis": d.as_dict()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["cpu", "gpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", nargs="+", help="workloads to run (default: all)")
    parser.add_argument("--data", default=".workloads-data", help="where the workloads write their data")
    parser.add_argument("--out", default="benchmarks/results", help="where the JSON and Markdown results go")
    parser.add_argument("--keep", help="an earlier result of this script: the workloads that --only leaves out are "
                        "carried over from it (each with the commit it was measured at)")  # fmt: skip
    parser.add_argument("--cases", nargs="+", choices=CASES,
                        help="re-run only these cases of the --only workloads; the others are carried over from "
                        "--keep, each case with the commit it was measured at")  # fmt: skip
    args = parser.parse_args()
    if args.cases and not args.keep:
        parser.error("--cases needs --keep (the result the other cases come from).")
    gpu = args.size == "gpu" and torch.cuda.is_available()
    results: dict[str, dict[str, Any]] = {}
    # with --cases the --only workloads are carried over too until each is re-run: a result written after the
    # first of them still holds the others' earlier cases
    carry = [n for n in names() if args.cases or (args.only and n not in args.only)]
    kept = carried_over(args.keep, carry, "workloads") if args.keep else {}
    results.update(kept)  # written from the first result on, so that a run cut short still holds them
    for name in names():
        if args.only and name not in args.only:
            continue
        module = importlib.import_module(name)
        expected = module.EXPECTED[args.size]
        entry: dict[str, Any] = {"expected": expected}
        if args.cases:  # the cases not re-run come from --keep, each with the commit it was measured at
            earlier = carried_over(args.keep, [name], "workloads").get(name)
            if earlier is None:
                parser.error(f"--cases needs {name} in the --keep result ({args.keep}).")
            for case in CASES:
                if case not in args.cases and case in earlier:
                    entry[case] = {**earlier[case], "git_commit": earlier[case].get("git_commit", earlier["git_commit"])}
            if "rounds" in earlier and not {"plain", "gpu_boost"} <= set(args.cases):
                entry["rounds"] = earlier["rounds"]
            if "best_rounds" in earlier and not {"ceiling", "best"} & set(args.cases):  # both or none re-run
                entry["best_rounds"] = earlier["best_rounds"]
        run = set(args.cases or CASES)
        if "plain" in run:
            print(f"{name}: plain ...", flush=True)
            entry["plain"] = fit(name, args.size, args.data)
        entry["right"] = entry["plain"]["verdict"] == expected
        if "doctor" in run:
            print(f"{name}: doctor ...", flush=True)
            entry["doctor"] = doctor(name, args.size, args.data)
        entry["doctor_right"] = entry["doctor"]["verdict"] == expected
        if gpu:
            from _best import BEST

            for case in ("gpu_boost", "ceiling", *(("best",) if name in BEST else ())):
                if case in run:
                    print(f"{name}: {case} ...", flush=True)
                    entry[case] = fit(name, args.size, args.data, case)
            if "best" in entry:
                from _best import ONE_TIME

                if name in ONE_TIME:  # preparation the best needs once per dataset (not per epoch), untimed
                    entry["best"]["one_time_s"] = ONE_TIME[name]
                # a workload whose ceiling varies from fit to fit (BEST_ROUNDS in its module) times the ceiling
                # and the best more often, interleaved, and compares their medians
                extra = getattr(module, "BEST_ROUNDS", 1)
                if extra > 1 and {"ceiling", "best"} <= run:
                    pairs = {c: [entry[c]["throughput"]["samples_per_s"]] for c in ("ceiling", "best")}
                    for k in range(1, extra):
                        for case in ("ceiling", "best"):
                            print(f"{name}: {case}, round {k + 1} ...", flush=True)
                            pairs[case].append(fit(name, args.size, args.data, case)["throughput"]["samples_per_s"])
                    entry["best_rounds"] = pairs
                if "best_rounds" in entry:
                    pairs = entry["best_rounds"]
                    entry["best_of_ceiling"] = float(np.median(pairs["best"]) / np.median(pairs["ceiling"]))
                else:
                    entry["best_of_ceiling"] = (entry["best"]["throughput"]["samples_per_s"]
                                                / entry["ceiling"]["throughput"]["samples_per_s"])  # fmt: skip
            # a workload whose own step varies from run to run (ROUNDS in its module) is compared over more
            # rounds of plain and GPUBoost, interleaved, their medians; one round otherwise
            if "rounds" in entry:
                rates = entry["rounds"]
            else:
                rates = {c: [entry[c]["throughput"]["samples_per_s"]] for c in ("plain", "gpu_boost")}
                for k in range(1, getattr(module, "ROUNDS", 1)):
                    for case in ("plain", "gpu_boost"):
                        print(f"{name}: {case}, round {k + 1} ...", flush=True)
                        rates[case].append(fit(name, args.size, args.data, case)["throughput"]["samples_per_s"])
                if len(rates["plain"]) > 1:
                    entry["rounds"] = rates
            plain = float(np.median(rates["plain"]))
            entry["gpu_boost_vs_plain"] = float(np.median(rates["gpu_boost"])) / plain
            entry["gpu_boost_of_ceiling"] = (entry["gpu_boost"]["throughput"]["samples_per_s"]
                                             / entry["ceiling"]["throughput"]["samples_per_s"])  # fmt: skip
        results[name] = entry
        print(f"{name}: verdict {entry['plain']['verdict']}, doctor {entry['doctor']['verdict']} (expected {expected})"
              + (f", GPUBoost {entry['gpu_boost_vs_plain']:.2f}x plain, {100 * entry['gpu_boost_of_ceiling']:.0f} % "
                 "of the ceiling" if gpu else ""), flush=True)  # fmt: skip
        path = write(results, args.size, gpu, args.out)  # after each workload: a run cut short keeps what it did
        print(f"wrote {path}", flush=True)
    for key, b in bars_of(results, gpu).items():
        print(f"{key}: {b['value']} (target {b['target']}, pass={b['pass']})")


def bars_of(results: dict[str, dict[str, Any]], gpu: bool) -> dict[str, Any]:
    right = sum(r["right"] for r in results.values())
    bars = {"verdicts_right": bar(right, len(results), "workloads"),
            "doctor_verdicts_right": bar(sum(r.get("doctor_right", False) for r in results.values()), len(results),
                                         "workloads")}  # fmt: skip
    if gpu:
        fed = [r for n, r in results.items() if n in ("tokens_lm", "host_bound")]
        data_bound = [r for r in results.values() if r["expected"] in DATA_BOUND]
        bars["starvation_warnings_fed"] = bar(sum(r["plain"]["starvation_warnings"] for r in fed), 0, "warnings",
                                              higher_is_better=False)  # fmt: skip
        bars["gpu_boost_vs_plain_min"] = bar(min(r["gpu_boost_vs_plain"] for r in results.values()), 0.98, "x")
        if data_bound:
            bars["gpu_boost_vs_plain_min_data_bound"] = bar(min(r["gpu_boost_vs_plain"] for r in data_bound), 3.0, "x")
            best = [r["best_of_ceiling"] for r in data_bound if "best_of_ceiling" in r]
            if best:  # the bar: each data-bound workload's documented best
                bars["best_of_ceiling_min_data_bound"] = bar(min(best), 0.90, "ratio")
        bars["steady_state_halves_max_diff"] = bar(
            worst_halves_diff([{c: r[c]["throughput"] for c in ("plain", "gpu_boost", "ceiling", "best") if c in r}
                               for r in results.values()]), 0.05, "ratio", higher_is_better=False)  # fmt: skip
    return bars


def write(results: dict[str, dict[str, Any]], size: str, gpu: bool, out: str) -> Path:
    results = {n: results[n] for n in names() if n in results}  # in NAMES order
    done: dict[str, Any] = {"size": size, "workloads": results, "complete": len(results) == len(names())}
    data_bound = [r for r in results.values() if "gpu_boost_of_ceiling" in r and r["expected"] in DATA_BOUND]
    if data_bound:  # a figure, not one of the bars: GPUBoost() alone is not asked to reach the ceiling
        done["gpu_boost_of_ceiling_min_data_bound"] = min(r["gpu_boost_of_ceiling"] for r in data_bound)
    return write_result("workloads", done, bars_of(results, gpu), out)


if __name__ == "__main__":
    main()
