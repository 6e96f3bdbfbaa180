"""What ``benchmarks/gpu_decode.py``'s fits record beside the throughput meter: when the ``auto`` placement was
decided (and the window opened after it), each thread's CPU time in the timed window with the decoders' counts,
a cProfile of chosen steps, and the training stream's timeline (its steps and the gaps between them); and the
helpers its parts share (every thread on a part's CPUs, a case's median round, DALI's values against the per-image
path's)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback


def _decision(boost: Any) -> Any:
    """The ``auto`` placement's decision (with the decoder's choice, where it follows) while the fit runs
    (``StreamPrefetch.decode_placement`` is set only at its end), else ``None``."""
    stage = boost.parts["prefetch"].gpu_decode
    return None if stage is None else stage.decision


class OpenAfterPlacement(Callback):
    """The ``auto`` cases: once the placement is decided, the throughput meter's warm-up (the most the case waits,
    ``--auto-warmup``) comes down to that step plus the loader's queue (the batches made before the decision), so
    the window times the decided placement on every host, however long the search took (inside one epoch: the
    meter opens it after the queue's warm-up counted from its epoch's start)."""

    def __init__(self, boost: Any) -> None:
        self.boost, self.decided_at = boost, None

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter

        if self.decided_at is None and _decision(self.boost) is not None:
            self.decided_at = trainer.global_step
            for meter in (c for c in trainer.callbacks if isinstance(c, ThroughputMeter)):
                meter.warmup = min(meter.warmup, self.decided_at + meter.queue)

    def figures(self) -> dict[str, Any]:
        return {"placement_decided_at_step": self.decided_at}


def thread_cpu() -> dict[int, tuple[str, float]]:
    """This process's threads: id -> (name, CPU seconds so far), from ``/proc/self/task``; a Python thread by its
    ``threading`` name (``py:...``), the others by the kernel's (DALI's, torch's, the driver's)."""
    import threading

    python = {t.native_id: f"py:{t.name}" for t in threading.enumerate()}
    tick, out = os.sysconf("SC_CLK_TCK"), {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        name, fields = stat[stat.index("(") + 1: stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        tid = int(task.name)
        out[tid] = (python.get(tid, name), (int(fields[11]) + int(fields[12])) / tick)  # utime, stime
    return out


class ThreadsAndDecoders(Callback):
    """Each thread of the training process: its CPU seconds per second of the meter's window (from the step it
    opened to the fit's end), the busiest first, and the threads counted by name; the GPU decode's counts (samples
    decoded on the GPU, by the workers, on the CPU here; batches DALI failed on) and the training thread's seconds in
    DALI's pipelines (``DaliWindows.timings``)."""

    def __init__(self, boost: Any) -> None:
        self.boost, self.meter, self.start, self.figures_ = boost, None, None, {}

    def on_train_start(self, trainer: Any, *args: Any) -> None:
        from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter

        self.meter = next((c for c in trainer.callbacks if isinstance(c, ThroughputMeter)), None)

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if self.start is None and self.meter is not None and self.meter.opened_at is not None:
            import time

            self.start = (time.perf_counter(), thread_cpu())

    def on_train_end(self, trainer: Any, *args: Any) -> None:
        import time

        if self.start is not None:
            wall, before = time.perf_counter() - self.start[0], self.start[1]
            busy = sorted(((name, (cpu - before.get(tid, (name, 0.0))[1]) / wall) for tid, (name, cpu)
                           in thread_cpu().items()), key=lambda t: -t[1])  # fmt: skip
            by_name: dict[str, list[float]] = {}
            for name, cores in busy:
                by_name.setdefault(name, []).append(cores)
            self.figures_["window_thread_cores"] = [[n, round(c, 3)] for n, c in busy[:12]]
            self.figures_["window_threads_by_name"] = {n: [len(c), round(sum(c), 3)] for n, c in by_name.items()}
        stage = self.boost.parts["prefetch"].gpu_decode
        if stage is not None:
            keys = ("decoded_on_gpu", "decoded_by_workers", "decoded_on_cpu_here", "dali_failures")
            self.figures_["decoder_counts"] = {k: sum(getattr(d, k) for d in stage._decoders.values()) for k in keys}
            # DALI's pipelines (open until the teardown): the training thread's seconds in them, by what it did
            self.figures_["dali_timings"] = [dict(d._dali.timings) for d in stage._decoders.values() if d._dali]

    def figures(self) -> dict[str, Any]:
        return self.figures_


class MainThreadProfile(Callback):
    """The ``gpu`` cases with ``--profile-steps``: cProfile from step ``first`` to ``last`` (or the fit's end). On
    Python 3.12 and newer cProfile hooks every thread of the process (``sys.monitoring``) onto one stack: the other
    threads' calls (the pin-memory thread's, NVML's samplers') are counted, and a function's cumulative time can
    take in another thread's; read the calls' own times, not where the time went by thread."""

    def __init__(self, first: int, last: int) -> None:
        import cProfile

        self.first, self.last, self.prof, self.on, self.stopped_at = first, last, cProfile.Profile(), False, None

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.first:
            self.prof.enable()
            self.on = True

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if self.on and trainer.global_step >= self.last:
            self.prof.disable()
            self.on, self.stopped_at = False, trainer.global_step

    def on_train_end(self, trainer: Any, *args: Any) -> None:
        if self.on:  # the fit ended first: its teardown stays out
            self.prof.disable()
            self.on, self.stopped_at = False, trainer.global_step

    def figures(self) -> dict[str, Any]:
        import io
        import pstats

        if self.on:
            self.prof.disable()
        out: dict[str, Any] = {"main_thread_profiled_steps": [self.first, self.stopped_at]}
        for key in ("tottime", "cumtime"):
            text = io.StringIO()
            pstats.Stats(self.prof, stream=text).sort_stats(key).print_stats(30)
            out[f"main_thread_cprofile_{key}"] = text.getvalue()[-7000:]
        return out


class KernelProfile(Callback):
    """The cases with ``--kernel-profile``: torch's profiler (CUPTI) from step ``first`` to ``last``, over every
    CUDA kernel the process ran, ours, DALI's and nvJPEG's too: device time per step, by kernel name (the largest),
    and by who launched it (:func:`kernel_owner`): what the decode's work on the GPU costs beside the step."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last, self.prof, self.steps = first, last, None, 0

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.first and self.prof is None:
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if self.prof is not None and not self.steps and trainer.global_step >= self.last:
            self._stop(trainer.global_step)

    def on_train_end(self, trainer: Any, *args: Any) -> None:
        if self.prof is not None and not self.steps:
            self._stop(trainer.global_step)

    def _stop(self, step: int) -> None:
        import torch

        torch.cuda.synchronize()
        self.prof.__exit__(None, None, None)
        self.steps = max(1, step - self.first)

    def figures(self) -> dict[str, Any]:
        if self.prof is None or not self.steps:
            return {}
        return kernel_figures(self.prof.key_averages(), self.steps)


def kernel_owner(name: str) -> str:
    """Who launched a kernel, from its name: ``dali`` (DALI's and nvJPEG's/nvImageCodec's), ``copy`` (memory
    copies and sets), ``annotation`` (a range the profiler marks on the GPU's timeline, such as
    ``Optimizer.step#SGD.step``: its time is the kernels' inside it, counted again), else ``torch`` (the step, and
    our normalize)."""
    if "#" in name or name.startswith(("ProfilerStep", "[")):
        return "annotation"
    low = name.lower()
    if any(k in low for k in ("dali", "nvjpeg", "nvimgcodec", "jpeg", "resampl", "crop", "flip")):
        return "dali"
    if "memcpy" in low or low.startswith("memset"):
        return "copy"
    return "torch"


def kernel_figures(averages: Any, steps: int, top: int = 25) -> dict[str, Any]:
    """Device time per step (ms) by owner and for the ``top`` kernels, from a profiler's ``key_averages()``."""
    rows = []
    for evt in averages:  # the kernels and copies themselves: an operator's row repeats its kernels' time
        if not str(getattr(evt, "device_type", "")).endswith("CUDA"):
            continue
        device_us = getattr(evt, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(evt, "self_cuda_time_total", 0.0)
        if device_us:
            rows.append((evt.key, float(device_us), int(evt.count)))
    rows.sort(key=lambda r: -r[1])
    rows = [r for r in rows if kernel_owner(r[0]) != "annotation"]
    by_owner: dict[str, float] = {}
    for name, us, _ in rows:
        owner = kernel_owner(name)
        by_owner[owner] = by_owner.get(owner, 0.0) + us / 1000 / steps
    return {"kernel_steps": steps, "kernel_ms_per_step_by_owner": by_owner,
            "kernel_ms_per_step_top": [[name[:120], us / 1000 / steps, count / steps] for name, us, count in rows[:top]]}  # fmt: skip


class GpuTimeline(Callback):
    """The cases with ``--timeline``: where the training stream's GPU time goes over the fit's last ``keep`` steps.
    An event is recorded on the training stream as each step starts (after its batch was handed out: the wait for
    the batch's decode is enqueued before it) and as it ends; at the fit's end they are read once. A step's GPU time
    is start to end; the gap before it is the last step's end to its start: the training stream idle, waiting for
    the batch's decode (its ready event) or for the training thread to enqueue the step. The thread's own times: from
    a step's start to its end (enqueuing it) and to the next step's start (a cycle, the next batch's fetch in it); a
    cycle as long as the GPU's step means the thread, not the GPU, sets the pace. Which one: as a step
    starts, the thread asks whether the GPU has finished the last step; where not (the thread is ahead), a gap after
    it is the decode's; where it has, the thread was late. No synchronization inside the run. As each step ends, NVML
    is read for the SMs' clock (MHz), the board's power (W) and the JPEG engines' busy percent: a step slower at a
    lower clock is held by power; engines idle beside the decode mean it runs on the SMs."""

    def __init__(self, keep: int = 96) -> None:
        self.keep, self.steps = keep, []  # [start event, end event or None, the thread ahead, its start and end times]
        self.clocks: list[tuple[int, float, float | None]] = []  # (SM MHz, W, JPEG engines %) as steps ended
        self._nvml: Any = None

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        import time

        import torch

        ahead = bool(self.steps) and self.steps[-1][1] is not None and not self.steps[-1][1].query()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        self.steps.append([start, None, ahead, time.perf_counter(), None])
        del self.steps[: -self.keep - 1]

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        import time

        import torch

        if self.steps and self.steps[-1][1] is None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.steps[-1][1] = end
            self.steps[-1][4] = time.perf_counter()
        self._read_clocks(torch.cuda.current_device())

    def _read_clocks(self, index: int) -> None:
        try:
            import pynvml

            from lightning_gpu_boost.core.nvml import nvml_device

            if self._nvml is None:
                pynvml.nvmlInit()
                device = nvml_device(index)  # CUDA_VISIBLE_DEVICES honoured: an index or a UUID
                self._nvml = (pynvml.nvmlDeviceGetHandleByIndex(device) if isinstance(device, int) else
                              pynvml.nvmlDeviceGetHandleByUUID(device))  # fmt: skip
            if self._nvml is not False:
                self.clocks.append((pynvml.nvmlDeviceGetClockInfo(self._nvml, pynvml.NVML_CLOCK_SM),
                                    pynvml.nvmlDeviceGetPowerUsage(self._nvml) / 1000.0,
                                    self._engines_busy(pynvml)))  # fmt: skip
                del self.clocks[: -self.keep]
        except Exception:
            self._nvml = False  # no NVML here: the timeline goes without clocks

    def _engines_busy(self, pynvml: Any) -> float | None:
        """The JPEG engines' busy percent over NVML's last sampling period (``None`` where the driver has none):
        whether DALI's decode runs on them or on the SMs."""
        try:
            return float(pynvml.nvmlDeviceGetJpgUtilization(self._nvml)[0])
        except Exception:
            return None

    def figures(self) -> dict[str, Any]:
        try:
            return self._figures()
        except Exception as e:  # a probe's failure must not lose the case's figures
            return {"timeline_error": f"{type(e).__name__}: {e}"}

    def _figures(self) -> dict[str, Any]:
        import statistics
        from itertools import pairwise

        import torch

        done = [s for s in self.steps if s[1] is not None]
        if len(done) < 3:
            return {}
        torch.cuda.synchronize()
        step_ms = [s[0].elapsed_time(s[1]) for s in done[1:]]
        gaps = [(a[1].elapsed_time(b[0]), b[2]) for a, b in pairwise(done)]  # (ms, the thread ahead)
        ahead = [g for g, a in gaps if a]
        late = [g for g, a in gaps if not a]
        total = sum(step_ms) + sum(g for g, _ in gaps)
        jpg = [c[2] for c in self.clocks if c[2] is not None]
        thread_ms = [1000 * (s[4] - s[3]) for s in done[1:]]  # the thread enqueuing the step
        cycle_ms = [1000 * (b[3] - a[3]) for a, b in pairwise(done)]  # one step's start to the next's
        return {"timeline": {
            "steps": len(step_ms), "thread_step_ms_median": statistics.median(thread_ms),
            "thread_cycle_ms_median": statistics.median(cycle_ms), "gpu_step_ms_median": statistics.median(step_ms),
            "gpu_step_ms_mean": statistics.fmean(step_ms), "gap_ms_mean": statistics.fmean(g for g, _ in gaps),
            "gap_ms_max": max(g for g, _ in gaps), "idle_frac": sum(g for g, _ in gaps) / total,
            "thread_ahead_frac": len(ahead) / len(gaps),
            "gap_ms_mean_thread_ahead": statistics.fmean(ahead) if ahead else None,
            "gap_ms_mean_thread_late": statistics.fmean(late) if late else None,
            "sm_clock_mhz_median": statistics.median(c[0] for c in self.clocks) if self.clocks else None,
            "power_w_median": statistics.median(c[1] for c in self.clocks) if self.clocks else None,
            "jpeg_engines_busy_pct_median": statistics.median(jpg) if jpg else None}}  # fmt: skip


def process_on(cpus: list[int]) -> None:
    """Every thread of this process on ``cpus``: ``sched_setaffinity(0)`` sets the calling thread's alone, and a
    thread started while a part held the process to a few CPUs (torch's intra-op pool) kept them after it: the
    ``decoders`` part timed the CPU path at 166 img/s on 16 CPUs after ``resnet50_4cpus`` (2,852-5,435 first)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def lower_median(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The round whose rate is the median (the lower of the middle two), as measured, with every round's rate and
    their spread (largest less smallest, over the median)."""
    ranked = sorted(found, key=lambda r: r["samples_per_s"])
    chosen = ranked[(len(ranked) - 1) // 2]
    if len(found) == 1:
        return chosen
    rates = [r["samples_per_s"] for r in found]
    return {**chosen, "rounds_samples_per_s": rates, "rounds_spread": (max(rates) - min(rates)) / chosen["samples_per_s"]}


def dali_parity(batches: list[Any]) -> dict[str, float]:
    """DALI's images against the package's per-image path (nvJPEG, batched resampling) of the same records, in
    8-bit levels: mean and max absolute difference over ``batches``."""
    from lightning_gpu_boost.core.gpu_decode import BatchDecoder

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    through, per_image = BatchDecoder(mean, std, device="cuda"), BatchDecoder(mean, std, device="cuda", dali=False)
    scale = torch.tensor(std, device="cuda").view(1, 3, 1, 1) * 255
    total, count, most = 0.0, 0, 0.0
    for batch in batches:
        levels = ((through.end(through.begin([batch]))[0] - per_image([batch])[0]) * scale).abs()
        total, count, most = total + float(levels.sum()), count + levels.numel(), max(most, float(levels.max()))
    through.close()
    return {"mean_abs_levels": total / count, "max_abs_levels": most}
