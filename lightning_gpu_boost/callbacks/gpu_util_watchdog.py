"""``GPUUtilWatchdog``: see data starvation while training, say why, say what to change."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_gpu_boost import _checks as checks
from lightning_gpu_boost._lightning import peak_flops
from lightning_gpu_boost.callbacks._data_path import data_path
from lightning_gpu_boost.callbacks._run_facts import loader_facts, run_facts
from lightning_gpu_boost.core import watchdog_report as report
from lightning_gpu_boost.core.mfu import StepFlops
from lightning_gpu_boost.core.nvml import NVMLSampler
from lightning_gpu_boost.core.resume import gather_ranks
from lightning_gpu_boost.core.run_clock import LoaderActivity, RunClock
from lightning_gpu_boost.core.state_version import check_state_version
from lightning_gpu_boost.core.step_timer import StepTimer, StepTiming
from lightning_gpu_boost.core.verdicts import STARVED, RunFacts, Verdict, batch_kind, classify

__all__ = ['GPUStarvationError', 'GPUUtilWatchdog']


#: the version of :meth:`GPUUtilWatchdog.state_dict`
STATE_VERSION = 1


class GPUStarvationError(RuntimeError):
    """Raised by :class:`GPUUtilWatchdog` with ``on_starvation="raise"``."""


class GPUUtilWatchdog(Callback):
    """Watch every training step for data starvation; warn with a diagnosis and the next step to take.

    Per step it measures the **data wait**: on CUDA, the GPU's idle gap before the step (CUDA events at the
    step's edges, read one step late, never synchronizing); on CPU, the host's wait between steps. Gaps that
    hold validation, a checkpoint or an epoch boundary are not counted. A background thread samples this rank's
    GPU utilization and memory through NVML (timing-only where NVML is missing, not permitted, or on MIG).

    Over a rolling ``window`` of steps after ``warmup_steps`` it gives a verdict from the taxonomy ``doctor`` shares
    (:mod:`~lightning_gpu_boost.core.verdicts`: data-bound, remote-io-bound, host-bound, small, ok; data-bound is
    left only once the wait has halved). Entering a starved or host-bound verdict warns (rank zero, at most once
    every ``warn_every_n_steps``) with what it sees and the changes that fix it in this run, never an option already
    on. At the end of fit it also weighs the time outside the steps (worker start-up, epoch ends, validation,
    checkpoints): where it is at least a quarter of the run, the verdict is **between-steps**. The summary names
    the run's verdict (``run_verdict``); ``docs/gpu_util_watchdog.md`` has the rules and their evidence.

    Logged metrics (every ``log_every_n_steps``, through the Trainer's logger, per rank):
        - ``gpu_boost/data_wait_frac``: data wait / (wait + step), rolling window
        - ``gpu_boost/data_wait_ms``: mean data wait per step, rolling window
        - ``gpu_boost/step_ms``: mean step time (GPU time on CUDA), rolling window
        - ``gpu_boost/gpu_util``: mean NVML utilization (%) over the window (where NVML works)
        - ``gpu_boost/gpu_mem_frac``: GPU memory in use / total (where NVML works)
        - ``gpu_boost/sm_active``: share of the SMs busy (%, NVML GPM on Hopper and newer)
        - ``gpu_boost/mfu``: model FLOPs utilization: one step's FLOPs (counted once, torch's FlopCounterMode) per
          step time over the GPU's peak at the step's precision (Lightning's throughput utilities)
        - ``gpu_boost/starved``: 1.0 while the verdict is "starved", else 0.0
        - ``gpu_boost/workers_busy``: share of the loader workers' time on a CPU over the last window (Linux)
        - ``gpu_boost/download_mb_s``: MiB/s arriving in a remote stream's local cache over the last window

    Args:
        window: steps per verdict, ``>= 2``. Where NVML samples the GPU, a window also lasts at least
            :data:`~lightning_gpu_boost.core.watchdog_report.MIN_WINDOW_PERIODS` of the driver's sample periods (and
            :data:`~lightning_gpu_boost.core.watchdog_report.MIN_WINDOW_S`): a window of a
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
        self.window, self.warmup_steps, self.warn_every_n_steps = window, warmup_steps, warn_every_n_steps
        self.wait_threshold, self.util_threshold, self.on_starvation = wait_threshold, util_threshold, on_starvation
        self.sample_interval_s, self.plot_path, self.summary = sample_interval_s, plot_path, summary
        self._reset()

    def _reset(self) -> None:
        #: the latest window's verdict (:mod:`~lightning_gpu_boost.core.verdicts`), "warming up" before the first
        self.verdict: Verdict | Literal["warming up"] = "warming up"
        #: the run's verdict at the end of fit (its totals, and the time spent outside the steps)
        self.run_verdict: Verdict | None = None
        #: the share of the judged windows' time whose verdict is the run's (``None`` where no window was judged)
        self.run_verdict_share: float | None = None
        #: the time outside the steps (epoch ends and starts, validation) and the run's wall time
        self.clock = RunClock()
        self.run_advice: list[str] = []
        self.warnings: list[dict[str, Any]] = []
        self.timeline: list[dict[str, Any]] = []
        self.totals = {"steps": 0, "wait_ms": 0.0, "busy_ms": 0.0, "starved_steps": 0}
        self._recent: deque[StepTiming] = deque()
        self._window_start, self._last_warn_step, self._batch_kind = time.monotonic(), -(10**12), None
        self._timer: StepTimer | None = None
        self._sampler: NVMLSampler | None = None
        self._trainer: pl.Trainer | None = None
        self._flops, self._peak = StepFlops(), None  # MFU: one step's FLOPs counted once, the GPU's peak
        # whether waiting steps wait on busy workers or on a remote stream's downloads (per window, and the run)
        self._activity = LoaderActivity()

    # -- lifecycle --------------------------------------------------------------------------------------------
    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()
        self._trainer = trainer
        device = trainer.strategy.root_device
        # completed events read every 4 steps: a query costs as much as a record (launch-bound steps, core/step_timer)
        self._timer = StepTimer(cuda=device.type == "cuda", read_every=4)
        if device.type == "cuda":
            self._peak = peak_flops(trainer)
            self._sampler = NVMLSampler(device.index or 0, self.sample_interval_s).start()
            sampler = self._sampler
            if not sampler.available or sampler.sm_reason:
                said = f"{sampler.reason}; timing-only mode" if not sampler.available else f"no SM activity: {sampler.sm_reason}"
                rank_zero_info(f"GPUUtilWatchdog: {said}.")
        else:
            rank_zero_info("GPUUtilWatchdog: no CUDA device in use; host timings only.")

    def _stop(self, *args: Any, **kwargs: Any) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    teardown = on_exception = _stop  # type: ignore[assignment]  # a failed fit stops the sampler's thread too

    # -- gaps that are not data wait -------------------------------------------------------------------------
    def _skip(self, *args: Any) -> None:
        if self._timer is not None:
            self._timer.skip_next_gap()
        self.clock.gap()

    on_save_checkpoint = _skip  # type: ignore[assignment]

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._skip()
        self.clock.epoch_start()  # to its first batch: the loader's start (its workers' restart)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.clock.gap()
        loaders = loader_facts(trainer)["loaders"]
        if loaders:
            from lightning_gpu_boost.core.streaming.cache import CacheGrowth
            from lightning_gpu_boost.core.streaming.source import remote_stream

            stream = remote_stream(loaders[0].dataset)
            cache = stream["cache_dir"] if stream else None
            growth = (CacheGrowth(cache), CacheGrowth(cache)) if cache else (None, None)
            self._activity = LoaderActivity(loaders[0].num_workers, growth)
        self._restart_window()
        self._activity.start_run()

    def _restart_window(self) -> None:
        """A window starts now: NVML's samples, the workers' CPU time and the cache's size count from here."""
        self._window_start = time.monotonic()
        if self._sampler is not None:
            self._sampler.reset()
        self._activity.start_window()

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._skip()
        self.clock.validation_start(trainer.sanity_checking)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.clock.validation_end()

    # -- per step ---------------------------------------------------------------------------------------------
    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:  # fmt: skip
        if self.clock.step_start(batch_idx):  # the first step: start-up (workers, the first batch) is paid once
            self._batch_kind = batch_kind(batch)
        if self._peak and self._flops.flops is None and 1 <= trainer.global_step < self.warmup_steps:  # once, warm
            self._flops.start()
        if self._timer is not None:
            self._timer.step_start()

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:  # fmt: skip
        self.clock.step_end()
        if self._flops.counting:  # a step inside the warm-up (its timing is not judged)
            self._flops.stop()
        if self._timer is None:
            return
        step = trainer.global_step  # once: Lightning's property walks the loops (about 5 us a call)
        self._timer.step_end(step)
        for timing in self._timer.pop_ready():
            self._observe(trainer, timing)
        log_now = trainer.loggers and step % max(1, trainer.log_every_n_steps) == 0
        if log_now and len(self._recent) >= 2:
            metrics = self._window_metrics()
            pl_module.log_dict({f"gpu_boost/{k}": v for k, v in metrics.items() if v is not None and not math.isnan(v)},
                               on_step=True, on_epoch=False, logger=True, prog_bar=False, sync_dist=False)  # fmt: skip

    def _observe(self, trainer: pl.Trainer, timing: StepTiming, judge: bool = True) -> None:
        """Count ``timing`` in the run's totals and the window; ``judge``: close the window where it is long enough
        and judge it (not once training has ended: no advice, and no part asked to decide again, after the fact)."""
        self.totals["steps"] += 1
        if self.totals["steps"] <= self.warmup_steps:
            self._restart_window()
            if self.totals["steps"] == self.warmup_steps:  # warm-up ends: the run's readings start here
                self._activity.start_run()
            return
        if not math.isnan(timing.wait_ms):
            self.totals["wait_ms"] += timing.wait_ms
            self.totals["busy_ms"] += timing.busy_ms
        self._recent.append(timing)
        if self.verdict in STARVED:
            self.totals["starved_steps"] += 1
        if judge and len(self._recent) >= self.window and report.window_long_enough(self._sampler, self._window_start):
            metrics = self._window_metrics(close=True)
            self.timeline.append({"step": float(timing.step), **{k: v for k, v in metrics.items() if v is not None}})
            held = self._judge(trainer, metrics)
            self.timeline[-1]["verdict"] = held or self.verdict  # the phases of the run's summary
            self._recent.clear()
            self._window_start = time.monotonic()

    def _window_metrics(self, close: bool = False) -> dict[str, float | None]:
        """The window's figures; ``close``: the window ends here (the workers' CPU share and the cache's growth are
        read once per window, from its start)."""
        # between windows the logged figures are the last window's
        busy, down = self._activity.close_window() if close else self._activity.window
        return report.window_metrics(self._recent, self._sampler, self._window_start, self.verdict in STARVED,
                                     self._flops.flops, self._peak, busy, down)  # fmt: skip

    # -- the verdict ------------------------------------------------------------------------------------------
    def _judge(self, trainer: pl.Trainer, m: dict[str, float | None]) -> str | None:  # a verdict held back, if any
        wait_frac = m["data_wait_frac"]
        if wait_frac is None or math.isnan(wait_frac):
            return None
        e = report.evidence(m)
        verdict = classify(e, self.wait_threshold, self.util_threshold)
        previous = self.verdict
        if previous in STARVED and verdict not in STARVED:
            if wait_frac >= self.wait_threshold / 2:
                return None  # hysteresis: back to another verdict only once the wait has halved
        facts = self.facts(trainer) if verdict == "host-bound" != previous else None  # read on a change only
        if facts is not None and facts.decode_measuring:  # the search's own steps (2 x H200: windows around its
            return verdict  # share changes), neither the user's to fix nor the worker count's
        self.verdict = verdict
        if verdict == previous:
            return None
        if verdict in STARVED:
            found = loader_facts(trainer)
            self._report(trainer, m, report.starving_message(m, self.facts(trainer, found), found["loaders"], found["dali"],
                                                      verdict))  # fmt: skip
        elif facts is not None:  # host-bound: a worker count one of our parts chose is decided again by that part
            decided = report.ask_again(data_path(trainer), facts, m)  # the stage that chose the count decides
            self._report(trainer, m, report.host_message(m, facts, decided), starving=False)
        elif verdict == "small":
            message = report.small_message(m)
            self.warnings.append({"step": trainer.global_step, "verdict": verdict, "message": message})
            rank_zero_info(message)

    def facts(self, trainer: pl.Trainer, found: dict[str, Any] | None = None) -> RunFacts:
        """The run's configuration as the advice needs it, from the run record (:mod:`._run_facts`)."""
        return run_facts(trainer, self._batch_kind, found)

    def _report(self, trainer: pl.Trainer, m: dict[str, float | None], message: str, starving: bool = True) -> None:
        step = trainer.global_step
        self.warnings.append({"step": step, "verdict": self.verdict, "message": message})
        if (not starving or self.on_starvation == "warn") and step - self._last_warn_step >= self.warn_every_n_steps:
            self._last_warn_step = step
            rank_zero_warn(message)
        elif starving and self.on_starvation == "raise":
            raise GPUStarvationError(message)

    # -- the end ----------------------------------------------------------------------------------------------
    def rank_summary(self) -> dict[str, float]:
        # the run from its first step on (start-up before it is paid once per fit, not per epoch); the workers' CPU
        # share and the cache's growth since warm-up (read once, at the end of training)
        c = self.clock
        return report.rank_summary(self.totals, self.timeline, self.warmup_steps, c.between_s, c.validation_s,
                                   c.wall_s(), *self._activity.close_run(), epoch_start_s=c.epoch_start_s)  # fmt: skip

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.clock.train_end()
        if self._timer is not None:  # the last steps' completed events (read every few steps): counted, not judged
            for timing in self._timer.pop_ready(flush=True):
                self._observe(trainer, timing, judge=False)
        self._stop()
        mine = self.rank_summary()
        self.summaries = gather_ranks(mine).get("ranks", [mine])  # every rank's, on every rank
        facts = self.facts(trainer)
        self.run_verdict, e, self.run_verdict_share, self.run_advice = report.judge_run(
            self.summaries, self.timeline, facts, self.wait_threshold, self.util_threshold)  # fmt: skip
        if self.run_verdict == "between-steps":  # SpanEpochs, where it chose not to span, decides again
            message = report.between_message(e, self.run_advice, report.ask_again_between(data_path(trainer), facts, e))
            self.warnings.append({"step": trainer.global_step, "verdict": "between-steps", "message": message})
            rank_zero_warn(message)
        if self.summary:
            rank_zero_info(self.format_summary())
        if self.plot_path and trainer.global_rank == 0:
            report.plot_timeline(self.timeline, self.plot_path)

    def format_summary(self) -> str:
        return report.format_summary(self.summaries, self.run_verdict, self.run_advice, self.timeline,
                                     data_path(self._trainer).choices.changes if self._trainer is not None else [])  # fmt: skip

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "totals": dict(self.totals), "warnings": len(self.warnings)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_state_version("GPUUtilWatchdog", state_dict, STATE_VERSION)
        self.totals.update(state_dict.get("totals", {}))
