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
from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.nvml import NVMLSampler
from lightning_gpu_boost.core.prefetch import StreamPrefetcher
from lightning_gpu_boost.core.step_timer import StepTimer, StepTiming
from lightning_gpu_boost.core.workers import iter_loaders


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

    Over a rolling ``window`` of steps after ``warmup_steps``, the verdict is **starved** when the data wait is
    at least ``wait_threshold`` of the step time *and* the GPU utilization is below ``util_threshold`` (or
    unknown). It returns to **ok** only when the wait falls below half the threshold (hysteresis). On entering
    "starved" it warns (rank zero, at most once every ``warn_every_n_steps``) with what it sees: wait share,
    utilization, the step split, ``num_workers`` vs usable CPUs, ``pin_memory``, persistent workers, whether
    prefetching is on, the batch size; and what to change. When the GPU waits little but is still underused with
    little memory in use, it says the GPU is busy but small and points to a larger batch instead.

    Logged metrics (every ``log_every_n_steps``, through the Trainer's logger, per rank):
        - ``gpu_boost/data_wait_frac``: data wait / (wait + step), rolling window
        - ``gpu_boost/data_wait_ms``: mean data wait per step, rolling window
        - ``gpu_boost/step_ms``: mean step time (GPU time on CUDA), rolling window
        - ``gpu_boost/gpu_util``: mean NVML utilization (%) over the window (where NVML works)
        - ``gpu_boost/gpu_mem_frac``: GPU memory in use / total (where NVML works)
        - ``gpu_boost/starved``: 1.0 while the verdict is "starved", else 0.0

    Args:
        window: steps per verdict, ``>= 2``.
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
        self.verdict: Literal["warming up", "ok", "starved", "small"] = "warming up"
        self.warnings: list[dict[str, Any]] = []
        self.timeline: list[dict[str, float]] = []
        self.totals = {"steps": 0, "wait_ms": 0.0, "busy_ms": 0.0, "starved_steps": 0}
        self._recent: deque[StepTiming] = deque(maxlen=self.window)
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

    on_validation_start = on_train_epoch_start = on_save_checkpoint = _skip  # type: ignore[assignment]

    # -- per step ---------------------------------------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._timer is not None:
            self._timer.step_start()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
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
        if self.verdict == "starved":
            self.totals["starved_steps"] += 1
        if len(self._recent) == self.window:
            metrics = self._window_metrics()
            self.timeline.append(
                {"step": float(timing.step), **{k: v for k, v in metrics.items() if v is not None}}
            )
            self._judge(trainer, metrics)
            self._recent.clear()
            self._window_start = time.monotonic()

    def _window_metrics(self) -> dict[str, float | None]:
        wait = _nanmean([t.wait_ms for t in self._recent])
        busy = _nanmean([t.busy_ms for t in self._recent])
        util = self._sampler.mean_util(since=self._window_start) if self._sampler is not None else None
        mem = self._sampler.memory_fraction() if self._sampler is not None else None
        return {
            "data_wait_frac": wait / (wait + busy) if wait + busy > 0 else float("nan"),
            "data_wait_ms": wait,
            "step_ms": busy,
            "gpu_util": util,
            "gpu_mem_frac": mem,
            "starved": 1.0 if self.verdict == "starved" else 0.0,
        }

    # -- the verdict ------------------------------------------------------------------------------------------
    def _judge(self, trainer: pl.Trainer, m: dict[str, float | None]) -> None:
        wait_frac, util, mem = m["data_wait_frac"], m["gpu_util"], m["gpu_mem_frac"]
        if wait_frac is None or math.isnan(wait_frac):
            return
        low_util = util is None or util < self.util_threshold
        if self.verdict == "starved":
            if wait_frac < self.wait_threshold / 2:
                self.verdict = "ok"
            return
        if wait_frac >= self.wait_threshold and low_util:
            self.verdict = "starved"
            self._report(trainer, m, self._diagnose(trainer, m))
        elif util is not None and util < self.util_threshold and mem is not None and mem < 0.3:
            if self.verdict != "small":
                self.verdict = "small"
                self._report(trainer, m, self._diagnose_small(m), starving=False)
        else:
            self.verdict = "ok"

    def _loader_facts(self, trainer: pl.Trainer) -> dict[str, Any]:
        train = getattr(trainer, "train_dataloader", None)
        items = (
            train.values()
            if isinstance(train, dict)
            else train
            if isinstance(train, (list, tuple))
            else [train]
        )
        return {
            "prefetch": any(isinstance(x, StreamPrefetcher) for x in items),
            "dali": [x for x in items if type(x).__name__ == "DALILoader"],
            "loaders": list(iter_loaders(train)),
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
        facts = self._loader_facts(trainer)
        procs = trainer.num_devices if trainer.world_size > 1 else 1
        cpus = max(1, usable_cpus() // procs)
        cuda = trainer.strategy.root_device.type == "cuda"
        util = "unknown" if m["gpu_util"] is None else f"{m['gpu_util']:.0f} %"
        who = "GPU" if cuda else "Training"
        lines = [
            f"{who} is starving for data: {100 * m['data_wait_frac']:.0f} % of each step is spent waiting for the "
            f"next batch ({m['data_wait_ms']:.1f} ms waiting vs {m['step_ms']:.1f} ms computing per step), "
            f"GPU utilization {util}."
        ]
        advice = []
        for loader in facts["loaders"][:1]:
            workers = loader.num_workers
            lines.append(
                f"Train loader: num_workers={workers} of {cpus} usable CPUs per process, batch_size="
                f"{loader.batch_size}, pin_memory={loader.pin_memory}, persistent_workers="
                f"{loader.persistent_workers}"
                + (f", prefetch to GPU={'on' if facts['prefetch'] else 'off'}." if cuda else ".")
            )
            probe = self._worker_probe(trainer)
            if probe is not None and probe.num_workers == workers and not probe.conclusive:
                advice.append(
                    f"num_workers={workers} is yours, kept because the worker probe could not rank the counts within "
                    f"its budget ({probe.reason}): raise its budget_s (AutoNumWorkers/GPUBoost workers_budget_s)."
                )
            elif probe is not None and probe.num_workers == workers:
                advice.append(
                    f"num_workers={workers} was measured as the fastest count for this loader alone (batches/s by "
                    f"workers: {', '.join(f'{w}: {r:.1f}' for w, r in sorted(probe.table.items()))}); more workers "
                    "do not load faster, so each sample's cost is the ceiling: make it cheaper (smaller files, fewer CPU "
                    "transforms, features computed once ahead)"
                    + (", or decode with NVIDIA DALI (DALIDataModule)." if cuda else ".")
                )
            elif workers == 0:
                advice.append(
                    f"num_workers=0 loads every batch in the training process: add AutoNumWorkers() to the Trainer "
                    f"callbacks (or set num_workers to about {max(1, cpus - 1)})."
                )
            elif workers < cpus - 1:
                advice.append(
                    f"only {workers} of {cpus} CPUs load data: add AutoNumWorkers() to measure the best count."
                )
            else:
                uint8 = type(loader.dataset).__name__ in ("ImageFolderDataset", "LMDBImageDataset")
                options = [
                    *(
                        []
                        if uint8
                        else ["ship uint8 images and normalize on the GPU (ImageFolderDataModule)"]
                    ),
                    *(["decode with NVIDIA DALI (DALIDataModule)"] if cuda else []),
                    "make each sample cheaper to load (smaller files, fewer CPU transforms)",
                ]
                choices = options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]
                advice.append(
                    f"the workers already use every CPU, so CPU-side loading is the ceiling: {choices}."
                )
            if cuda and not loader.pin_memory:
                advice.append(
                    "pin_memory=False makes every host-to-GPU copy synchronous: set pin_memory=True."
                )
            if workers > 0 and not loader.persistent_workers:
                advice.append("persistent_workers=False restarts the workers every epoch: set it to True.")
        for dali in facts["dali"][:1]:
            lines.append(
                f"Train loader: DALI pipeline on {dali.device}, num_threads={dali.num_threads}, read_threads="
                f"{dali.read_threads}, prefetch_queue_depth={dali.prefetch_queue_depth}."
            )
            advice.append(
                "the DALI pipeline cannot keep up: where it decodes on the CPU, raise num_threads or switch "
                "DALIDataModule to decoder_device='mixed' (GPU decoding); where it decodes on the GPU, try "
                "decoder_device='cpu' if CPU cores are idle, or raise hw_decoder_load (hardware JPEG decoder on "
                "A100/H100); slow storage: raise read_threads or pack the files into LMDB."
            )
        if cuda and not facts["prefetch"] and not facts["dali"]:
            advice.append("StreamPrefetch() copies the next batch on a side stream while this step computes.")
        if not facts["loaders"] and not facts["dali"]:
            advice.append(
                "the train loader is not a torch DataLoader; check how fast it yields batches alone."
            )
        return "\n".join([*lines, "Next: " + " ".join(f"({i + 1}) {a}" for i, a in enumerate(advice))])

    def _diagnose_small(self, m: dict[str, float | None]) -> str:
        return (
            f"GPU is busy but small: it waits little for data ({100 * m['data_wait_frac']:.0f} % of each step) yet "
            f"utilization is {m['gpu_util']:.0f} % with {100 * (m['gpu_mem_frac'] or 0):.0f} % of its memory in "
            f"use and {m['step_ms']:.1f} ms steps. The data path is not the limit: try a larger batch (Lightning's "
            "BatchSizeFinder callback), or fewer, larger kernels (torch.compile)."
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
        return {
            "steps": float(self.totals["steps"]),
            "data_wait_frac": wait / (wait + busy) if wait + busy > 0 else float("nan"),
            "step_ms": busy / max(1, self.totals["steps"] - self.warmup_steps),
            "gpu_util": sum(utils) / len(utils) if utils else float("nan"),
            "starved_frac": self.totals["starved_steps"] / max(1, self.totals["steps"] - self.warmup_steps),
        }

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop()
        mine = self.rank_summary()
        keys = list(mine)
        local = torch.tensor([mine[k] for k in keys], dtype=torch.float64, device=pl_module.device)
        gathered = trainer.strategy.all_gather(local) if trainer.world_size > 1 else local.unsqueeze(0)
        self.summaries = [
            dict(zip(keys, row.tolist(), strict=True)) for row in gathered.reshape(-1, len(keys)).cpu()
        ]
        if self.summary:
            rank_zero_info(self.format_summary())
        if self.plot_path and trainer.global_rank == 0:
            self._plot(self.plot_path)

    def format_summary(self) -> str:
        rows = ["rank | steps | GPU util | data wait | step ms | starved", "---|---|---|---|---|---"]
        for rank, s in enumerate(self.summaries):
            util = "n/a" if math.isnan(s["gpu_util"]) else f"{s['gpu_util']:.0f} %"
            rows.append(
                f"{rank} | {s['steps']:.0f} | {util} | {100 * s['data_wait_frac']:.0f} % | {s['step_ms']:.1f} | "
                f"{100 * s['starved_frac']:.0f} %"
            )
        slowest = max(range(len(self.summaries)), key=lambda r: self.summaries[r]["data_wait_frac"])
        verdict = "starved" if any(w["verdict"] == "starved" for w in self.warnings) else "ok"
        advice = (
            self.warnings[-1]["message"].split("Next: ", 1)[-1] if self.warnings else "nothing to change."
        )
        return (
            "GPUUtilWatchdog summary (the slowest rank sets the pace)\n" + "\n".join(rows) +
            f"\nverdict: {verdict} (slowest rank: {slowest}); advice: {advice}"
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
