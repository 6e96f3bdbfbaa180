"""``GPUUtilWatchdog``: see data starvation while training, say why, say what to change."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost.core.cpus import processes_per_node, usable_cpus
from lightning_gpu_boost.core.loaders import loader_entries
from lightning_gpu_boost.core.nvml import NVMLSampler
from lightning_gpu_boost.core.prefetch import StreamPrefetcher
from lightning_gpu_boost.core.step_timer import StepTimer, StepTiming
from lightning_gpu_boost.core.verdicts import (
    Evidence,
    RunFacts,
    Verdict,
    advise,
    batch_kind,
    classify,
    fetches_batches,
    format_advice,
)

#: a verdict's window lasts at least this many of NVML's sample periods, and this many seconds, where NVML samples
MIN_WINDOW_PERIODS, MIN_WINDOW_S = 4, 0.5


class GPUStarvationError(RuntimeError):
    """Raised by :class:`GPUUtilWatchdog` with ``on_starvation="raise"``."""


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else float("nan")


class GPUUtilWatchdog(Callback):
    """Watch every training step for data starvation; warn with a diagnosis and the next step to take.

    Per step it measures the **data wait**: on CUDA, the GPU's idle gap before the step (CUDA events at the
    step's edges, read one step late, never synchronizing); on CPU, the host's wait between steps. Gaps that
    hold validation, a checkpoint or an epoch boundary are not counted. A background thread samples this rank's
    GPU utilization and memory through NVML (timing-only where NVML is missing, not permitted, or on MIG).

    Over a rolling ``window`` of steps after ``warmup_steps`` it gives a verdict from the taxonomy that ``doctor``
    shares (:mod:`~lightning_gpu_boost.core.verdicts`): **data-bound** when the data wait is at least
    ``wait_threshold`` of the step time *and* the GPU utilization is below ``util_threshold`` (or unknown);
    **host-bound** when the GPU idles inside the step while steps hardly wait for data (syncs such as ``.item()``,
    Python work, launch overhead: no data change helps); **small** when the GPU is busy with little of its memory in
    use; else **ok**. It leaves data-bound only when the wait falls below half the threshold (hysteresis). On
    entering data-bound it warns (rank zero, at most once every ``warn_every_n_steps``) with what it sees: wait
    share, utilization, the step split, ``num_workers`` vs usable CPUs, ``pin_memory``, persistent workers, whether
    prefetching is on, the batch size; and the changes that fix it in this run (never an option already on, such as
    a worker tuner that already chose the count). Host-bound warns too, with its own advice. At the end of fit it
    also weighs the time spent outside the steps (worker start-up, epoch ends, validation, checkpoints), which the
    per-step figures leave out: where it is at least a quarter of the run, the verdict is **between-steps**, with
    advice such as ``persistent_workers=True``. The summary names the run's verdict (``run_verdict``).

    Logged metrics (every ``log_every_n_steps``, through the Trainer's logger, per rank):
        - ``gpu_boost/data_wait_frac``: data wait / (wait + step), rolling window
        - ``gpu_boost/data_wait_ms``: mean data wait per step, rolling window
        - ``gpu_boost/step_ms``: mean step time (GPU time on CUDA), rolling window
        - ``gpu_boost/gpu_util``: mean NVML utilization (%) over the window (where NVML works)
        - ``gpu_boost/gpu_mem_frac``: GPU memory in use / total (where NVML works)
        - ``gpu_boost/starved``: 1.0 while the verdict is "starved", else 0.0

    Args:
        window: steps per verdict, ``>= 2``. Where NVML samples the GPU, a window also lasts at least
            :data:`MIN_WINDOW_PERIODS` of the driver's sample periods (and :data:`MIN_WINDOW_S`): a window of a
            few short steps would hold no utilization sample.
        warmup_steps: first steps ignored, ``>= 0``.
        wait_threshold: data-wait share that counts as starving, in ``(0, 1)``.
        util_threshold: GPU utilization (%) below which a waiting GPU counts as starving, in ``(0, 100]``.
        on_starvation: ``"warn"``, ``"raise"`` a :class:`GPUStarvationError`, or ``"ignore"`` (metrics only).
        warn_every_n_steps: at most one warning per this many steps, ``>= 1``.
        sample_interval_s: NVML polling interval in seconds, ``> 0``.
        plot_path: write a PNG timeline of utilization and data wait at the end of fit (needs matplotlib).
        summary: log a summary table at the end of fit.

    Raises:
        ValueError: an argument out of range (the message names it and the valid range).
        GPUStarvationError: during training, with ``on_starvation="raise"``.

    Example::

        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[GPUUtilWatchdog(window=20, on_starvation="warn")], logger=False)
    """

    def __init__(
        self,
        window: int = 20,
        warmup_steps: int = 10,
        wait_threshold: float = 0.2,
        util_threshold: float = 80.0,
        on_starvation: Literal["warn", "raise", "ignore"] = "warn",
        warn_every_n_steps: int = 500,
        sample_interval_s: float = 0.1,
        plot_path: str | None = None,
        summary: bool = True,
    ) -> None:
        checks.check_int("window", window, low=2)
        checks.check_int("warmup_steps", warmup_steps, low=0)
        checks.check_number("wait_threshold", wait_threshold, low=0.0, high=1.0, low_open=True, high_open=True)
        checks.check_number("util_threshold", util_threshold, low=0.0, high=100.0, low_open=True)
        checks.check_choice("on_starvation", on_starvation, ("warn", "raise", "ignore"))
        checks.check_int("warn_every_n_steps", warn_every_n_steps, low=1)
        checks.check_number("sample_interval_s", sample_interval_s, low=0.0, low_open=True)
        checks.check_writable_file("plot_path", plot_path)  # now, not after training
        checks.check_bool("summary", summary)
        self.window = window
        self.warmup_steps = warmup_steps
        self.wait_threshold = wait_threshold
        self.util_threshold = util_threshold
        self.on_starvation = on_starvation
        self.warn_every_n_steps = warn_every_n_steps
        self.sample_interval_s = sample_interval_s
        self.plot_path = plot_path
        self.summary = summary
        self._reset()

    def _reset(self) -> None:
        #: the latest window's verdict (:mod:`~lightning_gpu_boost.core.verdicts`), "warming up" before the first
        self.verdict: Verdict | Literal["warming up"] = "warming up"
        #: the run's verdict at the end of fit (its totals, and the time spent outside the steps)
        self.run_verdict: Verdict | None = None
        self._train_start: float | None = None
        self._last_end: float | None = None
        self._in_gap = True  # the time before the next step is outside the steps (start, epoch end, validation)
        self.between_s = 0.0
        self.validation_s = 0.0
        self._val_start: float | None = None
        self._end: float | None = None
        self._first_start: float | None = None
        self._batch_kind: str | None = None
        self.run_advice: list[str] = []
        self.warnings: list[dict[str, Any]] = []
        self.timeline: list[dict[str, float]] = []
        self.totals = {"steps": 0, "wait_ms": 0.0, "busy_ms": 0.0, "starved_steps": 0}
        self._recent: deque[StepTiming] = deque()
        self._window_start = time.monotonic()
        self._last_warn_step = -(10**12)
        self._timer: StepTimer | None = None
        self._sampler: NVMLSampler | None = None

    # -- lifecycle --------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        device = trainer.strategy.root_device
        self._timer = StepTimer(cuda=device.type == "cuda")
        if device.type == "cuda":
            self._sampler = NVMLSampler(device.index or 0, self.sample_interval_s).start()
            if not self._sampler.available:
                rank_zero_info(f"GPUUtilWatchdog: {self._sampler.reason}; timing-only mode.")
        else:
            rank_zero_info("GPUUtilWatchdog: no CUDA device in use; host timings only.")

    def _stop(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._stop()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._stop()

    # -- gaps that are not data wait -------------------------------------------------------------------------
    def _skip(self, *args: Any) -> None:
        if self._timer is not None:
            self._timer.skip_next_gap()
        self._in_gap = True

    on_train_epoch_start = on_save_checkpoint = _skip  # type: ignore[assignment]

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._train_start = time.perf_counter()
        self._in_gap = True

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._skip()
        if not trainer.sanity_checking:
            self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._val_start is not None:
            self.validation_s += time.perf_counter() - self._val_start
            self._val_start = None

    # -- per step ---------------------------------------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._last_end is None:  # the first step: start-up (workers, the first batch) is paid once per fit
            if self._first_start is None:
                self._first_start = now
                self._batch_kind = batch_kind(batch)
        elif self._in_gap:  # an epoch's end (workers restart), validation, a checkpoint
            self.between_s += now - self._last_end
        self._in_gap = False
        if self._timer is not None:
            self._timer.step_start()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._last_end = time.perf_counter()
        if self._timer is None:
            return
        self._timer.step_end(trainer.global_step)
        for timing in self._timer.pop_ready():
            self._observe(trainer, timing)
        log_now = trainer.loggers and trainer.global_step % max(1, trainer.log_every_n_steps) == 0
        if log_now and len(self._recent) >= 2:
            metrics = self._window_metrics()
            pl_module.log_dict(
                {f"gpu_boost/{k}": v for k, v in metrics.items() if v is not None and not math.isnan(v)},
                on_step=True, on_epoch=False, logger=True, prog_bar=False, sync_dist=False,
            )  # fmt: skip

    def _observe(self, trainer: pl.Trainer, timing: StepTiming) -> None:
        self.totals["steps"] += 1
        if self.totals["steps"] <= self.warmup_steps:
            self._window_start = time.monotonic()
            if self._sampler is not None:
                self._sampler.reset()
            return
        if not math.isnan(timing.wait_ms):
            self.totals["wait_ms"] += timing.wait_ms
            self.totals["busy_ms"] += timing.busy_ms
        self._recent.append(timing)
        if self.verdict in ("data-bound", "copy-bound"):
            self.totals["starved_steps"] += 1
        if len(self._recent) >= self.window and self._window_long_enough():
            metrics = self._window_metrics()
            self.timeline.append(
                {"step": float(timing.step), **{k: v for k, v in metrics.items() if v is not None}}
            )
            self._judge(trainer, metrics)
            self._recent.clear()
            self._window_start = time.monotonic()

    def _window_long_enough(self) -> bool:
        """NVML's samples each cover a driver period (1/6 s to 1 s): a window closes after a few of them."""
        sampler = self._sampler
        if sampler is None or not sampler.available:
            return True
        least = max(MIN_WINDOW_S, MIN_WINDOW_PERIODS * (sampler.sample_period() or 0.0))
        return time.monotonic() - self._window_start >= least

    def _window_metrics(self) -> dict[str, float | None]:
        wait = _nanmean([t.wait_ms for t in self._recent])
        busy = _nanmean([t.busy_ms for t in self._recent])
        util = self._sampler.mean_util(since=self._window_start, settle=True) if self._sampler is not None else None
        mem = self._sampler.memory_fraction() if self._sampler is not None else None
        return {
            "data_wait_frac": wait / (wait + busy) if wait + busy > 0 else float("nan"),
            "data_wait_ms": wait,
            "step_ms": busy,
            "gpu_util": util,
            "gpu_mem_frac": mem,
            "starved": 1.0 if self.verdict in ("data-bound", "copy-bound") else 0.0,
        }

    # -- the verdict ------------------------------------------------------------------------------------------
    def _evidence(self, m: dict[str, float | None]) -> Evidence:
        return Evidence(
            data_wait_frac=float("nan") if m["data_wait_frac"] is None else float(m["data_wait_frac"]),
            step_ms=float(m["step_ms"] or 0.0), data_wait_ms=float(m["data_wait_ms"] or 0.0),
            gpu_util=m["gpu_util"], gpu_mem_frac=m["gpu_mem_frac"],
        )  # fmt: skip

    def _judge(self, trainer: pl.Trainer, m: dict[str, float | None]) -> None:
        wait_frac = m["data_wait_frac"]
        if wait_frac is None or math.isnan(wait_frac):
            return
        e = self._evidence(m)
        verdict = classify(e, self.wait_threshold, self.util_threshold)
        previous = self.verdict
        if previous in ("data-bound", "copy-bound") and verdict not in ("data-bound", "copy-bound"):
            if wait_frac >= self.wait_threshold / 2:
                return  # hysteresis: back to another verdict only once the wait has halved
        self.verdict = verdict
        if verdict == previous:
            return
        if verdict in ("data-bound", "copy-bound"):
            self._report(trainer, m, self._diagnose(trainer, m))
        elif verdict == "host-bound":
            self._report(trainer, m, self._diagnose_host(trainer, m), starving=False)
        elif verdict == "small":
            message = self._diagnose_small(m)
            self.warnings.append({"step": trainer.global_step, "verdict": verdict, "message": message})
            rank_zero_info(message)

    def facts(self, trainer: pl.Trainer, found: dict[str, Any] | None = None) -> RunFacts:
        """The run's configuration as the advice needs it (:class:`~lightning_gpu_boost.core.verdicts.RunFacts`);
        ``found``: :meth:`_loader_facts` where the caller has it already."""
        found = found or self._loader_facts(trainer)
        loader = found["loaders"][0] if found["loaders"] else None
        procs = processes_per_node(trainer)
        probe = self._worker_probe(trainer)
        names = {type(c).__name__ for c in trainer.callbacks}
        dm = getattr(trainer, "datamodule", None)
        tuner = probe is not None or bool(names & {"AutoNumWorkers", "GPUBoost"}) or getattr(dm, "num_workers", None) == "auto"
        val = [(v.num_workers, bool(v.persistent_workers) or spanned)
               for v, spanned in loader_entries(getattr(trainer, "val_dataloaders", None))]  # fmt: skip
        batches = trainer.num_training_batches
        return RunFacts(
            cuda=trainer.strategy.root_device.type == "cuda",
            num_workers=None if loader is None else loader.num_workers,
            usable_cpus=max(1, usable_cpus() // procs),
            batch_size=None if loader is None else loader.batch_size,
            pin_memory=None if loader is None else loader.pin_memory,
            persistent_workers=None if loader is None else loader.persistent_workers or id(loader) in found.get("spanned", ()),
            prefetch=found["prefetch"], dali=bool(found["dali"]),
            uint8_images=loader is not None and type(loader.dataset).__name__ in ("ImageFolderDataset", "LMDBImageDataset"),
            tuner=tuner, probe=probe, val_loaders=val, batch_kind=self._batch_kind,
            batched_fetch=loader is not None and fetches_batches(loader),
            spans_epochs=loader is not None and id(loader) in found.get("spanned", ()),
            batches_per_epoch=int(batches) if isinstance(batches, int) or (isinstance(batches, float) and math.isfinite(batches)) else None,
        )  # fmt: skip

    def _loader_facts(self, trainer: pl.Trainer) -> dict[str, Any]:
        train = getattr(trainer, "train_dataloader", None)
        items = (
            train.values()
            if isinstance(train, dict)
            else train
            if isinstance(train, (list, tuple))
            else [train]
        )
        entries = list(loader_entries(train))
        return {
            "prefetch": any(isinstance(x, StreamPrefetcher) for x in items),
            "dali": [x for x in items if type(x).__name__ == "DALILoader"],
            "loaders": [loader for loader, _ in entries],
            "spanned": {id(loader) for loader, spanned in entries if spanned},
        }

    @staticmethod
    def _worker_probe(trainer: pl.Trainer) -> Any:
        """The train loader's worker probe where one ran in this fit (AutoNumWorkers, GPUBoost or a DataModule's
        ``num_workers="auto"``), else None."""
        found = []
        for callback in trainer.callbacks:
            parts = [callback, *getattr(callback, "parts", {}).values()]
            found += [p.probes["train"] for p in parts if "train" in (getattr(p, "probes", None) or {})]
        probes = getattr(getattr(trainer, "datamodule", None), "auto_probes", None) or {}
        if "train" in probes:
            found.append(probes["train"])
        return found[0] if found else None

    def _diagnose(self, trainer: pl.Trainer, m: dict[str, float | None]) -> str:
        found = self._loader_facts(trainer)
        facts = self.facts(trainer, found)
        util = "unknown" if m["gpu_util"] is None else f"{m['gpu_util']:.0f} %"
        who = "GPU" if facts.cuda else "Training"
        lines = [
            f"{who} is starving for data: {100 * m['data_wait_frac']:.0f} % of each step is spent waiting for the "
            f"next batch ({m['data_wait_ms']:.1f} ms waiting vs {m['step_ms']:.1f} ms computing per step), "
            f"GPU utilization {util}."
        ]
        for loader in found["loaders"][:1]:
            lines.append(
                f"Train loader: num_workers={loader.num_workers} of {facts.usable_cpus} usable CPUs per process, "
                f"batch_size={loader.batch_size}, pin_memory={loader.pin_memory}, persistent_workers="
                f"{loader.persistent_workers}"
                + (f", prefetch to GPU={'on' if facts.prefetch else 'off'}." if facts.cuda else ".")
            )
        for dali in found["dali"][:1]:
            lines.append(
                f"Train loader: DALI pipeline on {dali.device}, num_threads={dali.num_threads}, read_threads="
                f"{dali.read_threads}, prefetch_queue_depth={dali.prefetch_queue_depth}."
            )
        verdict = self.verdict if self.verdict in ("data-bound", "copy-bound") else "data-bound"
        return "\n".join([*lines, format_advice(advise(verdict, facts, self._evidence(m)))])

    def _diagnose_host(self, trainer: pl.Trainer, m: dict[str, float | None]) -> str:
        e = self._evidence(m)
        return (
            f"GPU is idle inside the step: utilization {m['gpu_util']:.0f} % while steps wait only "
            f"{100 * e.data_wait_frac:.0f} % of their time for data ({m['step_ms']:.1f} ms per step). The step is "
            "host-bound (a sync, Python work or kernel launches), not data-bound.\n"
            + format_advice(advise("host-bound", self.facts(trainer), e))
        )

    def _diagnose_small(self, m: dict[str, float | None]) -> str:
        return (
            f"GPU is busy but small: it waits little for data ({100 * m['data_wait_frac']:.0f} % of each step) and "
            f"runs kernels {m['gpu_util']:.0f} % of the time, with {100 * (m['gpu_mem_frac'] or 0):.0f} % of its "
            f"memory in use and {m['step_ms']:.1f} ms steps. " + format_advice(advise("small", RunFacts()))
        )

    def _report(
        self, trainer: pl.Trainer, m: dict[str, float | None], message: str, starving: bool = True
    ) -> None:
        step = trainer.global_step
        self.warnings.append({"step": step, "verdict": self.verdict, "message": message})
        if not starving or self.on_starvation == "warn":
            if step - self._last_warn_step >= self.warn_every_n_steps:
                self._last_warn_step = step
                rank_zero_warn(message)
        elif self.on_starvation == "raise":
            raise GPUStarvationError(message)

    # -- the end ----------------------------------------------------------------------------------------------
    def rank_summary(self) -> dict[str, float]:
        wait, busy = self.totals["wait_ms"], self.totals["busy_ms"]
        utils = [p["gpu_util"] for p in self.timeline if "gpu_util" in p]
        mems = [p["gpu_mem_frac"] for p in self.timeline if "gpu_mem_frac" in p]
        # the run from its first step on (start-up before it is paid once per fit, not per epoch)
        wall = (self._end if self._end is not None else time.perf_counter()) - (self._first_start or time.perf_counter())
        return {
            "steps": float(self.totals["steps"]),
            "data_wait_frac": wait / (wait + busy) if wait + busy > 0 else float("nan"),
            "data_wait_ms": wait / max(1, self.totals["steps"] - self.warmup_steps),
            "step_ms": busy / max(1, self.totals["steps"] - self.warmup_steps),
            "gpu_util": sum(utils) / len(utils) if utils else float("nan"),
            "gpu_mem_frac": sum(mems) / len(mems) if mems else float("nan"),
            "starved_frac": self.totals["starved_steps"] / max(1, self.totals["steps"] - self.warmup_steps),
            "between_frac": self.between_s / wall if wall > 0 else float("nan"),
            "validation_frac": self.validation_s / wall if wall > 0 else float("nan"),
        }

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._end = time.perf_counter()
        if self._last_end is not None:
            self.between_s += self._end - self._last_end  # the last validation and the end of the epoch
        self._stop()
        mine = self.rank_summary()
        keys = list(mine)
        local = torch.tensor([mine[k] for k in keys], dtype=torch.float64, device=pl_module.device)
        gathered = trainer.strategy.all_gather(local) if trainer.world_size > 1 else local.unsqueeze(0)
        self.summaries = [
            dict(zip(keys, row.tolist(), strict=True)) for row in gathered.reshape(-1, len(keys)).cpu()
        ]
        slowest = self.summaries[self._slowest()]
        e = Evidence(
            data_wait_frac=slowest["data_wait_frac"], step_ms=slowest["step_ms"], data_wait_ms=slowest["data_wait_ms"],
            gpu_util=None if math.isnan(slowest["gpu_util"]) else slowest["gpu_util"],
            gpu_mem_frac=None if math.isnan(slowest["gpu_mem_frac"]) else slowest["gpu_mem_frac"],
            between_frac=slowest["between_frac"], validation_frac=slowest["validation_frac"],
        )  # fmt: skip
        self.run_verdict = classify(e, self.wait_threshold, self.util_threshold, include_between=True)
        self.run_advice = advise(self.run_verdict, self.facts(trainer), e)
        if self.run_verdict == "between-steps":
            message = (
                f"{100 * e.between_frac:.0f} % of the training run passed outside the steps (epoch ends with "
                f"worker restarts, validation {100 * (e.validation_frac or 0):.0f} %, checkpoints), which the "
                "per-step figures leave out.\n" + format_advice(self.run_advice)
            )
            self.warnings.append({"step": trainer.global_step, "verdict": "between-steps", "message": message})
            rank_zero_warn(message)
        if self.summary:
            rank_zero_info(self.format_summary())
        if self.plot_path and trainer.global_rank == 0:
            self._plot(self.plot_path)

    def _slowest(self) -> int:
        def key(rank: int) -> float:
            value = self.summaries[rank]["data_wait_frac"]
            return -1.0 if math.isnan(value) else value

        return max(range(len(self.summaries)), key=key)

    def format_summary(self) -> str:
        rows = ["rank | steps | GPU util | data wait | step ms | starved | outside steps",
                "---|---|---|---|---|---|---"]  # fmt: skip
        for rank, s in enumerate(self.summaries):
            util = "n/a" if math.isnan(s["gpu_util"]) else f"{s['gpu_util']:.0f} %"
            between = "n/a" if math.isnan(s["between_frac"]) else f"{100 * s['between_frac']:.0f} %"
            rows.append(
                f"{rank} | {s['steps']:.0f} | {util} | {100 * s['data_wait_frac']:.0f} % | {s['step_ms']:.1f} | "
                f"{100 * s['starved_frac']:.0f} % | {between}"
            )
        advice = " ".join(f"({i + 1}) {a}" for i, a in enumerate(self.run_advice or []))
        return (
            "GPUUtilWatchdog summary (the slowest rank sets the pace)\n" + "\n".join(rows) +
            f"\nverdict: {self.run_verdict} (slowest rank: {self._slowest()}); advice: {advice}"
        )  # fmt: skip

    def _plot(self, path: str) -> None:
        from lightning_gpu_boost._imports import require

        fig = require("matplotlib.figure").Figure(figsize=(8, 3))
        ax = fig.subplots()
        steps = [p["step"] for p in self.timeline]
        ax.plot(steps, [100 * p["data_wait_frac"] for p in self.timeline], label="data wait (%)")
        if any("gpu_util" in p for p in self.timeline):
            ax.plot(steps, [p.get("gpu_util", float("nan")) for p in self.timeline], label="GPU util (%)")
        ax.set_xlabel("step")
        ax.set_ylim(0, 100)
        ax.legend()
        ax.set_title("GPUUtilWatchdog")
        fig.tight_layout()
        fig.savefig(path)

    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "warnings": len(self.warnings)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.totals.update(state_dict.get("totals", {}))
