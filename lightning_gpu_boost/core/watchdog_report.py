"""What :class:`~lightning_gpu_boost.callbacks.GPUUtilWatchdog` says, framework-free: the messages of each verdict,
one rank's end-of-run summary, the table over ranks and the timeline plot. The callback measures; this module words
and draws what it measured."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from lightning_gpu_boost.core.mfu import mfu
from lightning_gpu_boost.core.verdicts import (
    STARVED,
    Evidence,
    RunFacts,
    advise,
    byte_rate,
    classify,
    crowded,
    format_advice,
)

__all__ = ["MIN_WINDOW_PERIODS", "PHASE_MAJORITY", "PROBLEM_SHARE", "agreement", "run_verdict", "time_shares", "ask_again", "ask_again_between", "phases", "MIN_WINDOW_S", "between_message", "nanmean", "window_long_enough", "window_metrics", "evidence", "format_summary", "host_message", "plot_timeline", "rank_summary", "slowest", "small_message",
           "starving_message", "summary_evidence", "upper_bound", "judge_run"]  # fmt: skip


#: a verdict's window lasts at least this many of NVML's sample periods, and this many seconds, where NVML samples
MIN_WINDOW_PERIODS, MIN_WINDOW_S = 4, 0.5


def nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def window_long_enough(sampler: Any, since: float) -> bool:
    """NVML's samples each cover a driver period (1/6 s to 1 s): a window closes after a few of them (always, where
    no sampler works). ``since``: the window's start on ``time.monotonic()``."""
    if sampler is None or not sampler.available:
        return True
    least = max(MIN_WINDOW_S, MIN_WINDOW_PERIODS * (sampler.sample_period() or 0.0))
    return time.monotonic() - since >= least


def window_metrics(recent: Any, sampler: Any, since: float, starved: bool, flops: float | None = None,
                   peak: float | None = None, workers_busy: float | None = None,
                   download_bytes_s: float | None = None) -> dict[str, float | None]:  # fmt: skip
    """A window's figures from its step timings (``recent``) and the NVML sampler's readings since ``since``; with
    the FLOPs of one step and the GPU's peak FLOP/s, the model FLOPs utilization over the window's steps; the
    loader workers' CPU share and a remote stream's download rate where they were read."""
    wait = nanmean([t.wait_ms for t in recent])
    busy = nanmean([t.busy_ms for t in recent])
    util = sampler.mean_util(since=since, settle=True) if sampler is not None else None
    mem = sampler.memory_fraction() if sampler is not None else None
    sm = sampler.mean_sm_active(since=since) if sampler is not None else None
    return {
        "data_wait_frac": wait / (wait + busy) if wait + busy > 0 else float("nan"),
        "data_wait_ms": wait,
        "step_ms": busy,
        "gpu_util": util,
        "gpu_mem_frac": mem,
        "sm_active": sm,
        "mfu": mfu(flops, (wait + busy) / 1000 if not math.isnan(wait + busy) else None, peak),
        "starved": 1.0 if starved else 0.0,
        "workers_busy": workers_busy,
        "download_mb_s": None if download_bytes_s is None else download_bytes_s / 2**20,
        # the steps training took per second over the window (what a loader must keep up with)
        "batches_s": len(recent) / elapsed if (elapsed := time.monotonic() - since) > 0 and len(recent) else None,
    }


def between_message(e: Evidence, advice: list[str], decided: str | None = None) -> str:
    """The end-of-run warning where the time outside the steps set the pace; ``decided``: what SpanEpochs said when
    asked again."""
    return (
        f"{100 * e.between_frac:.0f} % of the training run passed outside the steps (epoch ends with worker "
        f"restarts, validation {100 * (e.validation_frac or 0):.0f} %, checkpoints), which the per-step figures leave "
        "out.\n" + (f"{decided}\n" if decided else "") + format_advice(advice)
    )


def evidence(m: dict[str, float | None]) -> Evidence:
    """A window's metrics as the verdicts read them."""
    return Evidence(
        data_wait_frac=float("nan") if m["data_wait_frac"] is None else float(m["data_wait_frac"]),
        step_ms=float(m["step_ms"] or 0.0), data_wait_ms=float(m["data_wait_ms"] or 0.0),
        gpu_util=m["gpu_util"], gpu_mem_frac=m["gpu_mem_frac"], sm_active=m.get("sm_active"),
        workers_busy=m.get("workers_busy"), download_bytes_s=_bytes_s(m.get("download_mb_s")),
    )  # fmt: skip


def _bytes_s(mb_s: float | None) -> float | None:
    return None if mb_s is None or math.isnan(mb_s) else mb_s * 2**20


def starving_message(m: dict[str, float | None], facts: RunFacts, loaders: list[Any], dali: list[Any],
                     verdict: str) -> str:  # fmt: skip
    """The data-bound (or copy-bound) warning: what is seen, the train loader's settings, the changes that fix it."""
    util = "unknown" if m["gpu_util"] is None else f"{m['gpu_util']:.0f} %"
    who = "GPU" if facts.cuda else "Training"
    lines = [
        f"{who} is starving for data: {100 * m['data_wait_frac']:.0f} % of each step is spent waiting for the "  # type: ignore[operator]
        f"next batch ({m['data_wait_ms']:.1f} ms waiting vs {m['step_ms']:.1f} ms computing per step), "
        f"GPU utilization {util}."
    ]
    bound = upper_bound(m, facts.batch_size)
    if bound:
        lines.append(bound)
    for loader in loaders[:1]:
        lines.append(
            f"Train loader: num_workers={loader.num_workers} of {facts.usable_cpus} usable CPUs per process, "
            f"batch_size={loader.batch_size}, pin_memory={loader.pin_memory}, persistent_workers="
            f"{loader.persistent_workers}"
            + (f", prefetch to GPU={'on' if facts.prefetch else 'off'}." if facts.cuda else ".")
        )
    for pipe in dali[:1]:
        lines.append(
            f"Train loader: DALI pipeline on {pipe.device}, num_threads={pipe.num_threads}, read_threads="
            f"{pipe.read_threads}, prefetch_queue_depth={pipe.prefetch_queue_depth}."
        )
    if verdict == "remote-io-bound":
        lines[0] += (f" The loader's workers spend {100 * (m['workers_busy'] or 0):.0f} % of their time on a CPU "
                     f"while {byte_rate((m['download_mb_s'] or 0) * 2**20)} arrive in the stream's cache: the wait is on "
                     "downloads.")  # fmt: skip
    verdict = verdict if verdict in STARVED else "data-bound"
    return "\n".join([*lines, format_advice(advise(verdict, facts, evidence(m)))])  # type: ignore[arg-type]


def upper_bound(m: dict[str, float | None], batch_size: int | None) -> str | None:
    """What the data side's fixes can give at most, in samples/s: the window's rate now against the steps' own
    (the wait gone); ``None`` where the batch size or the timings are unknown."""
    wait, step = m.get("data_wait_ms"), m.get("step_ms")
    if not batch_size or wait is None or step is None or math.isnan(wait) or math.isnan(step) or step <= 0:
        return None
    now, ceiling = 1000 * batch_size / (wait + step), 1000 * batch_size / step
    return (f"Expected effect: {now:,.0f} samples/s now; with no wait the steps alone run {ceiling:,.0f} samples/s "
            f"({ceiling / now:.1f}x), the most that any change below can give.")  # fmt: skip


def ask_again(path: Any, facts: RunFacts, m: dict[str, float | None]) -> str | None:
    """Where the worker count one of our parts chose leaves the training process no CPU on a host-bound step, that
    part decides again (the advice never names a value for it); what it says, or ``None``."""
    if not crowded(facts) or "num_workers" not in facts.chosen_by:
        return None
    reason = (f"the GPU idles inside the step ({m['gpu_util']:.0f} % utilization while steps wait "
              f"{100 * evidence(m).data_wait_frac:.0f} % for data) and its {facts.num_workers} workers can use all "
              f"{facts.usable_cpus} CPUs, leaving none to the training process that launches the kernels")  # fmt: skip
    return path.propose("num_workers", facts.usable_cpus - 1, reason, training_batches_s=m.get("batches_s"))


def ask_again_between(path: Any, facts: RunFacts, e: Evidence) -> str | None:
    """Where a run ends with much of its time outside the steps and SpanEpochs chose not to span its train loader,
    SpanEpochs decides again (the advice never names a threshold for it); what it says, or ``None``."""
    choice = path.choices.chosen("span_epochs")
    if choice is None or choice.value or not facts.num_workers or e.between_frac is None:
        return None
    return path.propose("span_epochs", True, f"{100 * e.between_frac:.0f} % of the run passed outside the steps")


def host_message(m: dict[str, float | None], facts: RunFacts, decided: str | None = None) -> str:
    """The host-bound warning; ``decided``: what the part that chose the worker count said when asked again."""
    e = evidence(m)
    return (
        f"GPU is idle inside the step: utilization {m['gpu_util']:.0f} % while steps wait only "
        f"{100 * e.data_wait_frac:.0f} % of their time for data ({m['step_ms']:.1f} ms per step). The step is "
        "host-bound (a sync, Python work or kernel launches), not data-bound.\n"
        + (f"{decided}\n" if decided else "") + format_advice(advise("host-bound", facts, e))
    )


def small_message(m: dict[str, float | None]) -> str:
    return (
        f"GPU is busy but small: it waits little for data ({100 * m['data_wait_frac']:.0f} % of each step) and "  # type: ignore[operator]
        f"runs kernels {m['gpu_util']:.0f} % of the time, with {100 * (m['gpu_mem_frac'] or 0):.0f} % of its "
        f"memory in use and {m['step_ms']:.1f} ms steps. " + format_advice(advise("small", RunFacts()))
    )


def rank_summary(totals: dict[str, Any], timeline: list[dict[str, float]], warmup_steps: int, between_s: float,
                 validation_s: float, wall_s: float, workers_busy: float | None = None,
                 download_bytes_s: float | None = None, epoch_start_s: float = 0.0) -> dict[str, float]:  # fmt: skip
    """One rank's run: its totals after warm-up, its mean utilization and memory, and the shares of the run (from
    its first step on, ``wall_s``) spent between steps and validating. The workers' CPU share and a stream's
    download rate: over the windows whose steps waited, else ``workers_busy``/``download_bytes_s`` (the run's since
    warm-up, where no window closed)."""
    wait, busy = totals["wait_ms"], totals["busy_ms"]
    utils = [p["gpu_util"] for p in timeline if "gpu_util" in p]
    mems = [p["gpu_mem_frac"] for p in timeline if "gpu_mem_frac" in p]
    sms = [p["sm_active"] for p in timeline if p.get("sm_active") is not None]
    mfus = [p["mfu"] for p in timeline if p.get("mfu") is not None]
    # where the steps waited: were the workers busy, did the stream's cache grow (a wait on downloads)
    starved = [p for p in timeline if p.get("verdict") in STARVED]
    cpu = [p["workers_busy"] for p in starved if p.get("workers_busy") is not None]
    down = [p["download_mb_s"] for p in starved if p.get("download_mb_s") is not None]
    if not [p for p in timeline if p.get("verdict")]:  # no window closed: the run's own readings
        cpu = [] if workers_busy is None else [workers_busy]
        down = [] if download_bytes_s is None else [download_bytes_s / 2**20]
    return {
        "steps": float(totals["steps"]),
        "data_wait_frac": wait / (wait + busy) if wait + busy > 0 else float("nan"),
        "data_wait_ms": wait / max(1, totals["steps"] - warmup_steps),
        "step_ms": busy / max(1, totals["steps"] - warmup_steps),
        "gpu_util": sum(utils) / len(utils) if utils else float("nan"),
        "gpu_mem_frac": sum(mems) / len(mems) if mems else float("nan"),
        "sm_active": sum(sms) / len(sms) if sms else float("nan"),
        "mfu": sum(mfus) / len(mfus) if mfus else float("nan"),
        "starved_frac": totals["starved_steps"] / max(1, totals["steps"] - warmup_steps),
        "between_frac": between_s / wall_s if wall_s > 0 else float("nan"),
        "validation_frac": validation_s / wall_s if wall_s > 0 else float("nan"),
        "epoch_start_frac": epoch_start_s / wall_s if wall_s > 0 else float("nan"),
        "workers_busy": sum(cpu) / len(cpu) if cpu else float("nan"),
        "download_mb_s": sum(down) / len(down) if down else float("nan"),
    }


def slowest(summaries: list[dict[str, float]]) -> int:
    """The rank that waited most for data (it sets the pace)."""

    def key(rank: int) -> float:
        value = summaries[rank]["data_wait_frac"]
        return -1.0 if math.isnan(value) else value

    return max(range(len(summaries)), key=key)


def summary_evidence(s: dict[str, float]) -> Evidence:
    """A rank's summary as the run's verdict reads it."""
    return Evidence(
        data_wait_frac=s["data_wait_frac"], step_ms=s["step_ms"], data_wait_ms=s["data_wait_ms"],
        gpu_util=None if math.isnan(s["gpu_util"]) else s["gpu_util"],
        gpu_mem_frac=None if math.isnan(s["gpu_mem_frac"]) else s["gpu_mem_frac"],
        sm_active=None if math.isnan(s.get("sm_active", math.nan)) else s["sm_active"],
        between_frac=s["between_frac"], validation_frac=s["validation_frac"],
        epoch_start_frac=None if math.isnan(s.get("epoch_start_frac", math.nan)) else s["epoch_start_frac"],
        workers_busy=None if math.isnan(s.get("workers_busy", math.nan)) else s["workers_busy"],
        download_bytes_s=_bytes_s(s.get("download_mb_s", math.nan)),
    )  # fmt: skip


def phases(timeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive windows of one verdict merged: ``{"verdict", "from_step", "to_step", "windows"}`` in order (a run
    whose windows disagree is a run of phases, not a flip)."""
    out: list[dict[str, Any]] = []
    previous = 0.0
    for point in timeline:
        verdict = point.get("verdict")
        if verdict is None:
            continue
        if out and out[-1]["verdict"] == verdict:
            out[-1]["to_step"], out[-1]["windows"] = int(point["step"]), out[-1]["windows"] + 1
        else:
            out.append({"verdict": verdict, "from_step": int(previous), "to_step": int(point["step"]), "windows": 1})
        previous = point["step"]
    return out


#: the whole run's verdict stands where the windows that agree with it hold at least this share of the judged time;
#: below it the run is a run of phases (a link-bound first epoch, then a warm cache, say) whose averages can make a
#: verdict that no phase had
PHASE_MAJORITY = 0.5
#: in a run of phases, a problem (any verdict but ``ok``) whose windows hold at least this share of the judged time is
#: the run's verdict, the one that holds most if several do: a quarter of a run lost to one cause is worth its fix
PROBLEM_SHARE = 0.25

#: a window's figures that a phase's evidence averages (by the windows' time)
_PHASE_FIGURES = ("data_wait_frac", "data_wait_ms", "step_ms", "gpu_util", "gpu_mem_frac", "sm_active",
                  "workers_busy", "download_mb_s")  # fmt: skip


def _finite(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def _windows(timeline: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
    """The judged windows and the seconds each took (its steps times their wait and step)."""
    out, previous = [], 0.0
    for point in timeline:
        steps, previous = point["step"] - previous, point["step"]
        if point.get("verdict") is None:
            continue
        per_step = (_finite(point.get("data_wait_ms")) or 0.0) + (_finite(point.get("step_ms")) or 0.0)
        out.append((point, max(0.0, steps) * per_step / 1000))
    return out


def time_shares(timeline: list[dict[str, Any]]) -> dict[str, float]:
    """Each verdict's share of the judged windows' time (by windows where no time was measured)."""
    windows = _windows(timeline)
    total = sum(seconds for _, seconds in windows)
    shares: dict[str, float] = {}
    for point, seconds in windows:
        weight = seconds / total if total > 0 else 1 / len(windows)
        shares[point["verdict"]] = shares.get(point["verdict"], 0.0) + weight
    return shares


def run_verdict(whole_run: str, e: Evidence, timeline: list[dict[str, Any]]) -> tuple[str, Evidence, float | None]:
    """The run's verdict, the evidence its advice reads and the share of the judged time that agrees with it.

    ``whole_run`` (the classification of the whole run's figures, ``e``) stands where its windows hold at least
    :data:`PHASE_MAJORITY` of the judged time, and always for ``between-steps`` (time outside the steps, which no
    window sees). Otherwise the problem (not ``ok``) that holds the most time is the run's verdict where it holds at
    least :data:`PROBLEM_SHARE` of it, else the verdict that holds the most time, with evidence averaged over its
    windows (by their time; the whole run's figures outside the steps kept): a run whose first epoch waited on the
    link and whose second ran at the GPU's pace averages to a wait and a utilization that no phase had."""
    shares = time_shares(timeline)
    if not shares:
        return whole_run, e, None
    if whole_run == "between-steps" or shares.get(whole_run, 0.0) >= PHASE_MAJORITY:
        return whole_run, e, shares.get(whole_run, 0.0)
    problems = {v: share for v, share in shares.items() if v != "ok" and share >= PROBLEM_SHARE}
    verdict = max(problems or shares, key=lambda v: shares[v])
    if verdict == whole_run:
        return whole_run, e, shares[verdict]
    windows = [(p, seconds) for p, seconds in _windows(timeline) if p["verdict"] == verdict]
    figures: dict[str, float | None] = {}
    for key in _PHASE_FIGURES:
        known = [(v, seconds) for p, seconds in windows if (v := _finite(p.get(key))) is not None]
        weight = sum(seconds for _, seconds in known)
        figures[key] = (sum(v * seconds for v, seconds in known) / weight if weight > 0
                        else sum(v for v, _ in known) / len(known) if known else None)  # fmt: skip
    phase = replace(evidence(figures), between_frac=e.between_frac, validation_frac=e.validation_frac,
                    epoch_start_frac=e.epoch_start_frac, copy_ms=e.copy_ms)  # fmt: skip
    return verdict, phase, shares[verdict]


def agreement(timeline: list[dict[str, Any]], verdict: str | None) -> tuple[int, int]:
    """Windows whose verdict is the run's, and windows judged."""
    judged = [p["verdict"] for p in timeline if p.get("verdict") is not None]
    return sum(v == verdict for v in judged), len(judged)


def format_summary(summaries: list[dict[str, float]], verdict: str | None, advice: list[str],
                   timeline: list[dict[str, Any]] | None = None, changes: list[dict[str, Any]] | None = None) -> str:  # fmt: skip
    """The end-of-fit table, the run's verdict with how many of this rank's windows agree and its phases, the
    decisions our parts took again in training, and the advice."""
    rows = ["rank | steps | GPU util | SM active | MFU | data wait | step ms | starved | outside steps",
            "---|---|---|---|---|---|---|---|---"]  # fmt: skip

    def pct(value: float, scale: float = 1.0) -> str:
        return "n/a" if value is None or math.isnan(value) else f"{scale * value:.0f} %"

    def ms(value: float) -> str:  # no step timed after warm-up: nothing to show
        return "n/a" if value is None or math.isnan(value) or value <= 0 else f"{value:.1f}"

    for rank, s in enumerate(summaries):
        rows.append(
            f"{rank} | {s['steps']:.0f} | {pct(s['gpu_util'])} | {pct(s.get('sm_active', math.nan))} | "
            f"{pct(s.get('mfu', math.nan), 100)} | {pct(s['data_wait_frac'], 100)} | {ms(s['step_ms'])} | "
            f"{pct(s['starved_frac'], 100)} | {pct(s['between_frac'], 100)}"
        )
    told = " ".join(f"({i + 1}) {a}" for i, a in enumerate(advice or []))
    sure = ""
    agree, judged = agreement(timeline or [], verdict)
    if judged:
        steps = phases(timeline or [])
        timed = any(seconds > 0 for _, seconds in _windows(timeline or []))
        share = time_shares(timeline or []).get(verdict or "") if timed and verdict != "between-steps" else None
        sure = f"; {agree} of {judged} windows agree" + (f", {100 * share:.0f} % of their time" if share else "") + (
            "; phases: " + ", ".join(f"steps {p['from_step']}-{p['to_step']} {p['verdict']}" for p in steps)
            if len(steps) > 1 else "")  # fmt: skip
    again = "".join(f"\ndecided again: {c['said']}" for c in changes or [])
    return (
        "GPUUtilWatchdog summary (the slowest rank sets the pace)\n" + "\n".join(rows) +
        f"\nverdict: {verdict or 'too short to judge'} (slowest rank: {slowest(summaries)}{sure}){again}; advice: {told}"
    )  # fmt: skip


def plot_timeline(timeline: list[dict[str, float]], path: str) -> None:
    """A PNG of the data wait and GPU utilization per window (needs matplotlib: the ``plot`` extra)."""
    from lightning_gpu_boost._imports import require

    fig = require("matplotlib.figure").Figure(figsize=(8, 3))
    ax = fig.subplots()
    steps = [p["step"] for p in timeline]
    ax.plot(steps, [100 * p["data_wait_frac"] for p in timeline], label="data wait (%)")
    if any("gpu_util" in p for p in timeline):
        ax.plot(steps, [p.get("gpu_util", float("nan")) for p in timeline], label="GPU util (%)")
    ax.set_xlabel("step")
    ax.set_ylim(0, 100)
    ax.legend()
    ax.set_title("GPUUtilWatchdog")
    fig.tight_layout()
    fig.savefig(path)


def judge_run(summaries: list[dict[str, float]], timeline: list[dict[str, Any]], facts: Any, wait_threshold: float,
              util_threshold: float) -> tuple[Any, Any, float | None, list[str]]:  # fmt: skip
    """The run's verdict from every rank's summary (the slowest rank's evidence, the time outside the steps
    included), its evidence, the share of the judged time it held and its advice. A run of phases (a link-bound
    first epoch, then a warm one) is judged by the phase that took most time."""
    worst = summaries[slowest(summaries)]
    e = summary_evidence(worst)
    if math.isnan(worst.get("data_wait_frac", math.nan)):  # no step timed after the warm-up: nothing to judge
        return None, e, None, [f"too short to judge: {worst.get('steps', 0):.0f} steps, none timed after the "
                               "warm-up (GPUUtilWatchdog(warmup_steps=...)); a longer run gets a verdict"]  # fmt: skip
    whole_run = classify(e, wait_threshold, util_threshold, include_between=True)
    verdict, e, share = run_verdict(whole_run, e, timeline)
    return verdict, e, share, advise(verdict, facts, e)
