"""Diagnosis with one voice (issue 41): on every workload, the watchdog's verdict over repeated plain runs, its top
advice applied as a user would apply it, and the effect it predicted against the effect measured, in one run.

    python benchmarks/diagnosis.py                                   # GPU machine: --size gpu there
    python benchmarks/diagnosis.py --size cpu --only speech_ctc      # a smoke run on a CPU
    python benchmarks/diagnosis.py --only audio tabular --keep benchmarks/results/diagnosis-<date>-h200.json
    python benchmarks/diagnosis.py --only photos_hr --cache /tmp/diag-cache   # again after a time limit: goes on

For each workload of ``benchmarks/workloads`` (their own loaders and models, ``RUNNER.fit``, steady-state windows):

1. ``plain`` ``--repeats`` times (3): the run's verdict and top advice each time; ``verdict_agreement`` is the share
   of the repeats that give the most common verdict.
2. The top advice of the first plain run, applied (:func:`apply`): ``"nothing to change"`` runs the project again;
   ``AutoNumWorkers()``, ``num_workers=N``, ``persistent_workers=True``, ``SpanEpochs(min_restart_share=0)`` and
   ``StreamPrefetch()`` change the project's Trainer or loader as written; advice whose fix is code (uint8 + GPU transforms, GPU features, batched fetching,
   spanning epochs) runs the workload's documented implementation of it (``benchmarks/workloads/_best.py``), where
   it has one; otherwise the advice is recorded as not applied.
3. The prediction: for a worker count, the gain of ``doctor``'s short fits from the current to the advised count
   (the figure its advice quotes, "A -> B samples/s, Nx") on the rate of the first plain fit; for ``SpanEpochs``,
   the gain of ``doctor``'s short fits over whole epochs with and without it (else the watchdog's bound: the run
   without its time outside the steps); for ``persistent_workers=True``, the watchdog's stated bound (the run
   without its later epochs' starts); for another data-side fix, the watchdog's stated bound (the steps' own rate with the wait gone: "with no
   wait the steps alone run N samples/s"); for "nothing to change", the plain rate. Each is a gain over the first
   plain run (whose advice is applied), taken on the median of the plain runs' rates; ``prediction_error`` is
   ``|measured / predicted - 1|`` on the applied run's samples/s.
4. ``GPUBoost()`` once: a contradiction is advice that names a value for a setting one of our parts chose in that run
   (``num_workers`` chosen by its tuner, told "set num_workers=..." or "AutoNumWorkers()").

Where ``doctor`` runs (a worker-count advice), its loader figures are recorded beside the plain fits' rate: the loader
alone at the project's count, and the loader in training (its short fit at that count, where the fit ran at the
loader's pace). Where the plain fits were data-bound (the loader setting the pace), their differences are the figures
``doctor_loader_vs_data_bound_fit_error`` and ``doctor_loader_in_training_vs_data_bound_fit_error`` (issue 41: the
loader figure taken in training's conditions, within 10 %; figures, not bars).

The result is written after each workload (a workload that fails is recorded with its error and the rest still run).
``--rerun-applied`` (with ``--keep`` and ``--only``) keeps a row's plain runs and prediction, with their commit
(``kept_stages``), and runs its applied advice and ``GPUBoost()`` again: for a change to how the applied run is timed,
where the package and the workload's code are unchanged since that commit (checked with ``git diff`` where the
history is at hand; refused where they changed).

Bars (``diagnosis-<date>-<machine>.json``): ``workloads_with_advice_applied`` >= 10, ``prediction_error_max`` <= 0.25,
``self_contradictions`` == 0, ``verdict_repeat_agreement_min`` >= 0.9, ``steady_state_halves_max_diff`` <= 0.05 (the
timed windows of every plain and applied run).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "workloads"))
sys.path.insert(1, str(HERE.parent))

import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location("workloads_runner", HERE / "workloads" / "__main__.py")
RUNNER = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(RUNNER)  # type: ignore[union-attr]

from lightning_gpu_boost.core.results import bar, write_result  # noqa: E402

#: what a documented best (``_best.BEST``) implements: the advice it answers, by the advice's words
BEST_ANSWERS = ("uint8", "JointAugment", "LogMel", "__getitems__", "keep the table on the GPU", "SpanEpochs",
                "SpanningLoader", "persistent_workers=True", "pack --max-side")  # fmt: skip


def _rate(result: dict[str, Any]) -> float:
    return float(result["throughput"]["samples_per_s"])


def _halves(result: dict[str, Any]) -> float:
    value = result["throughput"].get("halves_diff")
    return float(value) if value is not None else float("nan")


def _edit(loader: Any, **changes: Any) -> Any:
    """The project's loader with ``changes`` (``num_workers``, ``persistent_workers``), as a user edits its
    arguments: the same dataset, sampler, batches, collate and pinning, its epochs unchanged."""
    from torch.utils.data import DataLoader, IterableDataset

    workers = changes.get("num_workers", loader.num_workers)
    kwargs: dict[str, Any] = {"num_workers": workers, "collate_fn": loader.collate_fn, "pin_memory": loader.pin_memory,
                              "worker_init_fn": loader.worker_init_fn, "timeout": loader.timeout}  # fmt: skip
    if workers:
        kwargs.update(persistent_workers=changes.get("persistent_workers", loader.persistent_workers),
                      prefetch_factor=loader.prefetch_factor or 2,
                      multiprocessing_context=loader.multiprocessing_context)  # fmt: skip
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is None:
        kwargs.update(sampler=loader.sampler, batch_size=None)
    else:
        kwargs["batch_sampler"] = loader.batch_sampler
    return DataLoader(loader.dataset, **kwargs)


def apply(name: str, advice: str) -> tuple[str, Any] | None:
    """``(how, change)`` for the top ``advice`` of workload ``name``: ``change`` is ``RUNNER.fit``'s ``change`` (or
    the string ``"best"`` / ``"repeat"``); ``None`` where the harness has no way to apply it."""
    from lightning_gpu_boost.callbacks import AutoNumWorkers, SpanEpochs, StreamPrefetch

    if advice.startswith("nothing to change"):
        return "repeat", "repeat"
    if "add AutoNumWorkers()" in advice:
        return "AutoNumWorkers()", lambda m, t, v, k: (m, t, v, k, [AutoNumWorkers()])
    count = re.search(r"set num_workers=(\d+)", advice) or re.search(r"set num_workers to about (\d+)", advice)
    if count:
        n = int(count.group(1))
        return f"num_workers={n}", lambda m, t, v, k: (m, _edit(t, num_workers=n), v, k, [])
    if "SpanEpochs(min_restart_share=0) in the callbacks" in advice:
        return "SpanEpochs(min_restart_share=0)", lambda m, t, v, k: (m, t, v, k, [SpanEpochs(min_restart_share=0)])
    if advice.startswith("persistent_workers=False restarts") or "persistent_workers=True keeps" in advice:
        return "persistent_workers=True", lambda m, t, v, k: (m, _edit(t, persistent_workers=True), v, k, [])
    if advice.startswith("StreamPrefetch()"):
        return "StreamPrefetch()", lambda m, t, v, k: (m, t, v, k, [StreamPrefetch()])
    from _best import BEST

    if name in BEST and any(words in advice for words in BEST_ANSWERS):
        return "the documented implementation (_best.py)", "best"
    return None


def predicted(name: str, how: str, plain: dict[str, Any], size: str, root: Path
              ) -> tuple[float | None, str, dict[str, Any] | None]:  # fmt: skip
    """What the package predicts for the applied advice, where the figure comes from, and where ``doctor`` ran, its
    loader figure (the loader alone at the project's count) beside the plain fit's rate and its short fit there."""
    if how == "repeat":
        return _rate(plain), "the plain rate (nothing to change)", None
    loader = None
    if how.startswith("num_workers=") or how == "AutoNumWorkers()":
        # its short fits of the model at the current and the advised count: the watchdog's bound assumes the wait
        # goes and nothing else changes, which more workers can break (they take the training process's CPU:
        # vit_finetune on the H200 measured 1.61x where the bound said 2.43x)
        d = RUNNER.doctor(name, size, root, tune=True, trials=True)["diagnosis"]
        fits = d.get("fit_samples_per_s") or {}
        # issue 41: the loader figure within 10 % of what the loader delivers in a fit where the run is data-bound
        loader = {"doctor_loader_samples_per_s": d.get("loader_samples_per_s"),
                  "doctor_loader_in_training_samples_per_s": d.get("loader_in_training_samples_per_s"),
                  "doctor_fit_at_current": fits.get(d.get("num_workers")), "plain_samples_per_s": _rate(plain)}
        advised, current = d.get("tuned_workers"), d.get("num_workers")
        if advised in fits and current in fits and fits[current]:
            # the gain its advice quotes ("short fits of the model measured A -> B samples/s, Nx") on the rate the
            # project's own fit measured: doctor's short fits share a bias at both counts (photos_hr on the H100:
            # 25.6/s at the current 4 workers where the plain fits read 18.4-23.3/s), which the ratio cancels
            loader["doctor_fit_at_advised"] = fits[advised]
            gain = float(fits[advised]) / float(fits[current])
            return (_rate(plain) * gain, f"doctor's short fits' gain ({gain:.2f}x, num_workers={current} -> "
                    f"{advised}) on the plain fit's rate", loader)  # fmt: skip
        if advised in fits:
            return float(fits[advised]), f"doctor's short fit at num_workers={advised}", loader
    w = plain.get("watchdog") or {}
    if how == "SpanEpochs(min_restart_share=0)":
        # doctor's short fits over whole epochs with and without spanning (what its advice quotes): the time outside
        # the steps is only a bound (short_epochs on an H100: 2.91x bound, 1.30x measured, data-bound once spanned)
        d = RUNNER.doctor(name, size, root, tune=False, trials=True)["diagnosis"]
        fits = d.get("span_fit_samples_per_s") or {}
        if fits.get("plain") and fits.get("spanned"):
            gain = fits["spanned"] / fits["plain"]
            return (_rate(plain) * gain, f"doctor's short fits over whole epochs ({gain:.2f}x with SpanEpochs) on the "
                    "plain fit's rate", {"doctor_span_fits": fits})  # fmt: skip
        from lightning_gpu_boost.core.verdicts import span_bound
        from lightning_gpu_boost.core.watchdog_report import summary_evidence

        gain = span_bound(summary_evidence(w)) if w.get("between_frac") is not None else None  # its advice's bound
        if gain is not None:
            return _rate(plain) * gain, "the watchdog's bound (the time outside the steps gone)", loader
    if how == "persistent_workers=True" and w.get("epoch_start_frac") is not None and w["epoch_start_frac"] < 1:
        return _rate(plain) / (1 - w["epoch_start_frac"]), "the watchdog's bound (the epochs' starts gone)", loader
    step, wait = w.get("step_ms"), w.get("data_wait_ms")
    if step and wait is not None and step > 0:
        return (_rate(plain) * (wait + step) / step, "the watchdog's bound (the steps' own rate, the wait gone)",
                loader)  # fmt: skip
    return None, "no prediction", loader


def contradictions(result: dict[str, Any]) -> list[str]:
    """Advice in a GPUBoost() run that names a worker count its tuner chose (our parts never contradict each
    other: the tuner is asked to decide again instead, which its own line says)."""
    told = [*result["advice"], *result["messages"]]
    return [a for a in told if ("set num_workers=" in a or "add AutoNumWorkers()" in a) and "decided again" not in a]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["cpu", "gpu"], default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--only", nargs="+", help="workloads to run, in this order (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="plain runs per workload")
    parser.add_argument("--data", default=".workloads-data", help="where the workloads write their data")
    parser.add_argument("--out", default="benchmarks/results", help="where the JSON and Markdown results go")
    parser.add_argument("--keep", help="an earlier result of this script: the workloads that --only leaves out are "
                        "carried over from it, each with the commit it was measured at (a GPU machine's call is "
                        "limited to minutes: run a few workloads per call, each call keeping the last's result)")  # fmt: skip
    parser.add_argument("--cache", help="a folder where each fit's and doctor's result is kept as it ends (pickled, "
                        "under the commit): a workload that a call's time limit cut short goes on from its last "
                        "finished fit when the same command runs again")  # fmt: skip
    parser.add_argument("--rerun-applied", action="store_true", help="for the workloads of --only, keep the --keep "
                        "row's plain runs and prediction (recorded with their commit) and run only the applied advice "
                        "and GPUBoost() again; refused where the package or the workload's code changed since that "
                        "commit (a change to how the applied run is timed, say)")  # fmt: skip
    parser.add_argument("--accept-changes", metavar="REASON", help="with --rerun-applied: go on where the code "
                        "changed since the kept commit, recording REASON and the changed files in the row (for a "
                        "change that cannot move the plain runs or the prediction: a figure added beside them)")  # fmt: skip
    args = parser.parse_args()
    root = Path(args.data)
    rows: dict[str, dict[str, Any]] = {}
    earlier: dict[str, dict[str, Any]] = {}
    if args.rerun_applied and not (args.keep and args.only):
        parser.error("--rerun-applied needs --keep (the earlier result) and --only (the workloads)")
    if args.keep:
        from _common import carried_over

        rows.update(carried_over(args.keep, [n for n in RUNNER.names() if not args.only or n not in args.only],
                                 "workloads"))  # fmt: skip
        if args.rerun_applied:
            import json

            kept_size = json.loads(Path(args.keep).read_text())["figures"]["config"].get("size")
            if kept_size != args.size:
                parser.error(f"--rerun-applied: {args.keep} was measured at --size {kept_size}, this run is {args.size}")
            earlier = carried_over(args.keep, args.only, "workloads")
    unknown = sorted(set(args.only or ()) - set(RUNNER.names()))
    if unknown:
        parser.error(f"--only: no workload named {', '.join(unknown)} (there are: {', '.join(RUNNER.names())})")
    missing = sorted(n for n in args.only or () if args.rerun_applied and not (earlier.get(n) or {}).get("applied"))
    if missing:
        parser.error(f"--rerun-applied: {args.keep} has no applied advice for {', '.join(missing)}")
    # in the order given: a GPU machine's time may end before the last one
    for name in dict.fromkeys(args.only or RUNNER.names()):
        try:
            rows[name] = diagnose_workload(name, args, root, earlier.get(name))
        except Exception as err:  # one workload's failure is recorded; the others still run
            import traceback

            traceback.print_exc()
            rows[name] = {"error": f"{type(err).__name__}: {err}"}
        # written after each workload: a GPU machine's call can end, or a process crash, before the last one
        print(f"wrote {write_result('diagnosis', *summarize(rows, args), args.out)}", flush=True)


_STARTED = time.monotonic()


def _since_start() -> str:
    """The run's age, for its progress lines (where a call's minutes went)."""
    return f"{time.monotonic() - _STARTED:.0f} s"


def _once_under(cache: str | None, name: str, size: str) -> Any:
    """``once(stage, fn, *args, **kwargs)``: ``fn``'s result, kept in ``cache`` (pickled, under the commit, the
    workload and its size) as it ends and read back there on the next run instead of running ``fn`` again; without a
    cache or a commit to key it by, ``fn``'s result. ``once.read`` lists the stages read back (their seconds are
    reads). Uncommitted edits share their commit's cache: commit before a series."""
    import pickle

    from lightning_gpu_boost.core.results import _git_commit

    commit = _git_commit() if cache else None
    if cache and not commit:
        print(f"{name}: --cache ignored: no commit to key it by (set GIT_COMMIT)", flush=True)

    def once(stage: str, fn: Any, *fn_args: Any, **fn_kwargs: Any) -> Any:
        if not commit:
            return fn(*fn_args, **fn_kwargs)
        path = Path(cache) / commit[:12] / f"{name}-{size}-{stage}.pickle"
        if path.exists():
            print(f"{name}: {stage} read from {path} (an earlier call's)", flush=True)
            once.read.append(stage)
            return pickle.loads(path.read_bytes())
        value = fn(*fn_args, **fn_kwargs)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".partial").write_bytes(pickle.dumps(value))
        path.with_suffix(".partial").replace(path)
        return value

    once.read = []  # type: ignore[attr-defined]
    return once


#: what ``--rerun-applied`` keeps of an earlier row (its plain runs and what doctor predicted from them)
KEPT_STAGES = ("verdicts", "verdict", "verdict_agreement", "top_advice", "plain_samples_per_s", "plain_halves_diff",
               "doctor_loader")  # fmt: skip


def _code_paths(name: str) -> list[str]:
    here = Path(__file__).resolve().parent
    return ["lightning_gpu_boost", f"benchmarks/workloads/{name}.py",
            *(f"benchmarks/workloads/{p.name}" for p in sorted((here / "workloads").glob("_*.py"))
              if not p.name.startswith("__"))]  # fmt: skip


def changed_since(commit: str | None, name: str) -> list[str] | None:
    """The files of the package and of workload ``name``'s own code (its module and the workloads' shared helpers,
    not the runner's ``__main__.py``, whose timing of the applied run is what a rerun is for) that differ now from
    ``commit`` (``git diff``); ``None`` where that cannot be told here (no git or no such commit)."""
    import subprocess

    if not commit:
        return None
    try:
        run = subprocess.run(["git", "diff", "--name-only", commit, "HEAD", "--", *_code_paths(name)],
                             cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                             timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout.split() if run.returncode == 0 else None


def code_unchanged_since(commit: str | None, name: str) -> bool | None:
    """Whether :func:`changed_since` finds no file changed since ``commit``; ``None`` where it cannot tell (a GPU
    machine may get the working tree without its history)."""
    files = changed_since(commit, name)
    return None if files is None else not files


def diagnose_workload(name: str, args: argparse.Namespace, root: Path, earlier: dict[str, Any] | None = None
                      ) -> dict[str, Any]:  # fmt: skip
    """One workload's row: its plain repeats, the top advice applied, the GPUBoost() run's contradictions.
    ``earlier`` (``--rerun-applied``): an earlier row whose plain runs and prediction are kept, with their commit."""
    clock = [time.perf_counter()]
    seconds: dict[str, float] = {}  # each stage's wall time, its data's first preparation in "plain" (planning)

    def lap(stage: str) -> None:
        clock.append(time.perf_counter())
        seconds[stage] = round(clock[-1] - clock[-2], 1)

    once = _once_under(args.cache, name, args.size)
    if earlier is not None:
        unchanged = code_unchanged_since(earlier.get("git_commit"), name)
        accepted = getattr(args, "accept_changes", None)  # --accept-changes REASON
        if unchanged is False and not accepted:
            raise ValueError(f"--rerun-applied: the package or {name}'s code changed since {earlier['git_commit']}, "
                             "which measured its plain runs: run the workload whole")  # fmt: skip
        said = {None: "not checked here: no git history", True: "yes", False: f"no, accepted: {accepted}"}
        print(f"{name}: plain runs and prediction kept from {earlier.get('git_commit')} (code unchanged since: "
              f"{said[unchanged]})", flush=True)  # fmt: skip
        row: dict[str, Any] = {k: earlier[k] for k in KEPT_STAGES if k in earlier}
        row["kept_stages"] = {"stages": ["plain", "prediction"], "git_commit": earlier.get("git_commit"),
                              "gpu": earlier.get("gpu"), "code_unchanged_since": unchanged}  # fmt: skip
        if unchanged is False:
            row["kept_stages"]["changes_accepted"] = {"reason": accepted,
                                                      "files": changed_since(earlier["git_commit"], name)}  # fmt: skip
        plains: list[dict[str, Any]] = []
    else:
        print(f"{name}: plain x{args.repeats} ... (at {_since_start()})", flush=True)
        plains = [once(f"plain-{i}", RUNNER.fit, name, args.size, root) for i in range(args.repeats)]
        lap("plain")
        verdicts = [p["verdict"] for p in plains]
        mode, count = Counter(verdicts).most_common(1)[0]
        row = {"verdicts": verdicts, "verdict": mode, "verdict_agreement": count / len(verdicts),
               "top_advice": (plains[0]["advice"] or [""])[0], "plain_samples_per_s": [_rate(p) for p in plains],
               "plain_halves_diff": [_halves(p) for p in plains]}  # fmt: skip
    chosen = apply(name, row["top_advice"])
    if chosen is None:
        row["applied"] = None
    else:
        how, change = chosen
        if earlier is not None:
            if how != earlier["applied"]["how"]:
                raise ValueError(f"--rerun-applied: {name}'s kept advice now applies as {how}, not as "
                                 f"{earlier['applied']['how']}: run the workload whole")  # fmt: skip
            gain, source = earlier["applied"]["predicted_gain"], earlier["applied"]["prediction_source"]
        else:
            guess, source, loader = once("prediction", predicted, name, how, plains[0], args.size, root)
            if loader is not None:
                row["doctor_loader"] = loader
            gain = guess / _rate(plains[0]) if guess else None
            lap("prediction")
        print(f"{name}: applying {how} ... (at {_since_start()})", flush=True)
        if change == "best":
            run = once("applied", RUNNER.fit, name, args.size, root, "best")
        elif change == "repeat":
            run = once("applied", RUNNER.fit, name, args.size, root)
        else:
            run = once("applied", RUNNER.fit, name, args.size, root, change=change)
        # the predicted gain is the first plain run's (whose advice is applied), taken on the plain runs' median:
        # one run's rate varies by 10-20 % from the next (vit_finetune on the H200: 1,367, 1,515, 1,682/s)
        base = median(row["plain_samples_per_s"])
        row["applied"] = {"how": how, "samples_per_s": _rate(run), "halves_diff": _halves(run),
                          "verdict_after": run["verdict"], "predicted_samples_per_s": gain * base if gain else None,
                          "prediction_source": source, "measured_gain": _rate(run) / base, "predicted_gain": gain,
                          "prediction_error": abs(_rate(run) / base / gain - 1) if gain else None}  # fmt: skip
        lap("applied")
    print(f"{name}: GPUBoost() ... (at {_since_start()})", flush=True)
    boosted = once("gpu_boost", RUNNER.fit, name, args.size, root, "gpu_boost")
    lap("gpu_boost")
    row["seconds"] = seconds
    if once.read:
        row["cached_stages"] = sorted(once.read)  # measured by an earlier call at the same commit; seconds are reads
    row["gpu_boost"] = {"verdict": boosted["verdict"], "advice": boosted["advice"],
                        "contradictions": contradictions(boosted)}  # fmt: skip
    print(f"{name}: {row['verdicts']} top advice applied: {row['applied']}", flush=True)
    return row


def _in_training(loader: dict[str, Any]) -> float | None:
    """doctor's figure for the loader in training (see :func:`summarize`)."""
    if "doctor_loader_in_training_samples_per_s" in loader:
        return loader["doctor_loader_in_training_samples_per_s"]
    return loader.get("doctor_fit_at_current")


def summarize(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> tuple[dict, dict]:
    """The figures and bars over the workloads done so far (a failed workload counts as one without advice
    applied, and its error is kept)."""
    errors_by_workload = {n: r["error"] for n, r in rows.items() if "error" in r}
    rows = {n: rows[n] for n in RUNNER.names() if n in rows}  # the workloads' order
    done = {n: r for n, r in rows.items() if "error" not in r}
    applied = [r["applied"] for r in done.values() if r["applied"]]
    errors = [a["prediction_error"] for a in applied if a["prediction_error"] is not None]
    halves = [h for r in done.values() for h in r["plain_halves_diff"]] + [a["halves_diff"] for a in applied]
    halves = [h for h in halves if h == h]
    # the doctor's loader figure against the loader's delivery in the plain fits, where these were data-bound
    loader_errors = {n: abs(r["doctor_loader"]["doctor_loader_samples_per_s"] / median(r["plain_samples_per_s"]) - 1)
                     for n, r in done.items() if r.get("doctor_loader") and r["verdict"] == "data-bound"
                     and r["doctor_loader"].get("doctor_loader_samples_per_s")}  # fmt: skip
    # doctor's figure for the loader in training (its short fit at the current count, where that fit ran at the
    # loader's pace; rows of runs before the figure had a name: the same short fit, which doctor printed as
    # "training (a short fit of the model)") against the same plain fits: issue 41's "within 10 %"
    in_training = {n: abs(_in_training(r["doctor_loader"]) / median(r["plain_samples_per_s"]) - 1)
                   for n, r in done.items() if r.get("doctor_loader") and r["verdict"] == "data-bound"
                   and _in_training(r["doctor_loader"])}  # fmt: skip
    figures = {"config": vars(args), "workloads": rows, "failed": errors_by_workload,
               "doctor_loader_vs_data_bound_fit_error": loader_errors,
               "doctor_loader_vs_data_bound_fit_error_max": max(loader_errors.values(), default=None),
               "doctor_loader_in_training_vs_data_bound_fit_error": in_training,
               "doctor_loader_in_training_vs_data_bound_fit_error_max": max(in_training.values(), default=None)}  # fmt: skip
    bars = {
        "workloads_with_advice_applied": bar(len(applied), 10, "workloads"),
        "prediction_error_max": bar(max(errors) if errors else float("nan"), 0.25, "abs(measured/predicted - 1)",
                                    higher_is_better=False),  # fmt: skip
        "self_contradictions": bar(sum(len(r["gpu_boost"]["contradictions"]) for r in done.values()), 0, "advice",
                                   higher_is_better=False),  # fmt: skip
        "verdict_repeat_agreement_min": bar(min((r["verdict_agreement"] for r in done.values()), default=float("nan")),
                                            0.9, "share"),  # fmt: skip
        "steady_state_halves_max_diff": bar(max(halves, default=float("nan")), 0.05, "ratio", higher_is_better=False),
        "workloads_failed": bar(len(errors_by_workload), 0, "workloads", higher_is_better=False),
    }
    return figures, bars


if __name__ == "__main__":
    main()
