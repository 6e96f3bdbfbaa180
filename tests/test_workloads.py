"""The workloads at CPU size: the watchdog's CPU-visible verdict on each plain project is
the one written in the workload before it first ran (data-bound, ok or between-steps; host-bound needs a GPU), the
same in each of three identical runs."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.helpers import Sleeping

WORKLOADS = Path(__file__).resolve().parent.parent / "benchmarks" / "workloads"


def _runner():
    spec = importlib.util.spec_from_file_location("workloads_runner", WORKLOADS / "__main__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # puts benchmarks/workloads on sys.path
    return module


RUNNER = _runner()


def meter_fit(dataset: Sleeping, max_epochs: int, num_workers: int = 0, callbacks: tuple = (),
              persistent: bool = False):  # fmt: skip
    """``VectorModel`` fit on ``dataset`` (one batch per item) under the runner's ``Meter`` (warm-up 2, 8 steps);
    the meter's summary and the trainer."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from tests.helpers import VectorModel

    meter = RUNNER.Meter(warmup=2, steps=8, sample_gpu_util=False)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=max_epochs, callbacks=[*callbacks, meter], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(VectorModel(), DataLoader(dataset, batch_size=None, num_workers=num_workers,
                                          persistent_workers=persistent))  # fmt: skip
    return meter.summary(), trainer


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    """The workloads' CPU-size data, written once per run: under pytest-xdist in a folder all workers share (the
    first to come writes it, under a lock, and the others find it complete), so that no worker writes the photos
    again."""
    import os

    from filelock import FileLock

    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "workloads-shared"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("workloads")
    with FileLock(f"{root}.lock"):
        for name in RUNNER.names():
            importlib.import_module(name).prepare(root, "cpu")
    return root


#: a phrase the advice for each data-bound workload must hold: the fix for what its batches carry, not image advice
ADVICE = {"jpeg_classification": "uint8", "photos_hr": "uint8", "segmentation": "JointAugment", "audio": "LogMel",
          "tabular": "__getitems__", "short_epochs": "persistent_workers=True", "speech_ctc": "LogMel",
          "vit_finetune": "uint8"}  # fmt: skip


#: identical runs of a workload: the verdict must be the same in each (issue 41: verdicts that stay)
REPEATS = 3


@pytest.mark.parametrize("name", RUNNER.names())
def test_each_workload_gets_its_expected_verdict_at_cpu_size_in_every_repeat(name, data_root):
    import torch

    threads = torch.get_num_threads()
    results = []
    try:
        for _ in range(REPEATS):
            results.append(RUNNER.fit(name, "cpu", data_root))
    finally:
        torch.set_num_threads(threads)
    expected = sys.modules[name].EXPECTED["cpu"]
    verdicts = [r["verdict"] for r in results]
    assert verdicts == [expected] * REPEATS, [(r["verdict"], r["watchdog"]) for r in results]
    result = results[0]
    if expected == "ok":
        assert result["starvation_warnings"] == 0
    if name in ADVICE:
        assert ADVICE[name] in " ".join(result["advice"]), result["advice"]
    if name in ("audio", "speech_ctc", "tokens_lm", "tokens_lm_text", "tabular"):
        assert "uint8 images" not in " ".join(result["advice"]), result["advice"]


def test_workloads_are_written_without_this_package():
    for path in WORKLOADS.glob("*.py"):
        if path.name in ("__main__.py", "__init__.py", "_best.py"):  # the harness and the documented fixes use it
            continue
        assert not re.search(r"^\s*(from|import)\s+lightning_gpu_boost", path.read_text(), re.M), path.name


@pytest.mark.parametrize("name", RUNNER.names())
def test_doctor_names_the_same_verdict_at_cpu_size(name, data_root):
    """``doctor`` measures the loader alone, the copy and the step on a resident batch: its verdict for each plain
    project is the one written in the workload, and its advice fits what the batches hold."""
    result = RUNNER.doctor(name, "cpu", data_root)
    expected = sys.modules[name].EXPECTED["cpu"]
    assert result["verdict"] == expected, result["diagnosis"]
    if name in ADVICE:
        assert ADVICE[name] in " ".join(result["advice"]), result["advice"]


@pytest.mark.parametrize("name", sorted(importlib.import_module("_best").BEST))
def test_each_documented_best_trains_at_cpu_size(name, data_root):
    """The documented fix of each data-bound workload (uint8 decoding with crops after the copy, joint
    augmentation, log-mel, batched rows, persistent workers) trains the project's own model; on a CPU its
    transforms run on the CPU, one batch ahead."""
    import torch

    threads = torch.get_num_threads()
    try:
        result = RUNNER.fit(name, "cpu", data_root, "best")
    finally:
        torch.set_num_threads(threads)
    assert result["throughput"]["samples_per_s"] > 0, result["throughput"]


def test_the_diagnosis_benchmark_applies_the_advice_as_written():
    """benchmarks/diagnosis.py turns each kind of top advice into the change a user makes (or the workload's
    documented implementation of it), and leaves alone what it cannot apply."""
    spec = importlib.util.spec_from_file_location("diagnosis", WORKLOADS.parent / "diagnosis.py")
    diagnosis = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diagnosis)
    cases = {
        "nothing to change: the GPU is the limit.": "repeat",
        "num_workers=0 loads every batch in the training process: add AutoNumWorkers() to the Trainer": "AutoNumWorkers()",
        "the loader's 16 workers can use all 16 CPUs ...: set num_workers=15, or move": "num_workers=15",
        "persistent_workers=False restarts the workers every epoch: set it to True.": "persistent_workers=True",
        "StreamPrefetch() copies the next batch on a side stream while this step computes.": "StreamPrefetch()",
        "65 % of the run passes outside the training steps (...): keep the train workers loading across epoch ends: "
        "SpanEpochs(min_restart_share=0) in the callbacks (GPUBoost() includes it at 5 %), or return "
        "SpanningLoader(DataLoader(...)) from train_dataloader(); a DataLoader's workers ...": "SpanEpochs(min_restart_share=0)",
    }  # fmt: skip
    for advice, how in cases.items():
        assert diagnosis.apply("jpeg_classification", advice)[0] == how, advice
    assert diagnosis.apply("segmentation", "... StreamPrefetch(transform=JointAugment(...)) ...")[1] == "best"
    assert diagnosis.apply("tokens_lm", "tokenize once ahead (a np.memmap of token ids)") is None
    assert diagnosis.apply("speech_ctc", "compute the features on the GPU per batch ... LogMel ...")[1] == "best"


def test_the_diagnosis_reruns_only_the_applied_advice_keeping_the_plain_runs_with_their_commit(monkeypatch):
    """--rerun-applied: the kept row's plain runs and prediction stay (with their commit), the applied advice and
    GPUBoost() run again; refused where the code changed since."""
    import argparse
    import subprocess

    spec = importlib.util.spec_from_file_location("diagnosis", WORKLOADS.parent / "diagnosis.py")
    diagnosis = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diagnosis)
    runs: list[tuple] = []

    def fit(name, size, root, case="plain", change=None):
        runs.append((case, change is not None))
        return {"throughput": {"samples_per_s": 30.0, "halves_diff": 0.01}, "verdict": "data-bound", "advice": [],
                "messages": []}  # fmt: skip

    monkeypatch.setattr(diagnosis.RUNNER, "fit", fit)
    earlier = {"verdicts": ["data-bound"] * 3, "verdict": "data-bound", "verdict_agreement": 1.0,
               "top_advice": "only 4 of 16 CPUs load data: add AutoNumWorkers() to measure the best count.",
               "plain_samples_per_s": [11.7, 9.6, 9.4], "plain_halves_diff": [0.001, 0.007, 0.008],
               "applied": {"how": "AutoNumWorkers()", "predicted_gain": 3.0, "prediction_source": "doctor's fits"},
               "git_commit": "a" * 40, "gpu": "NVIDIA H200"}  # fmt: skip
    args = argparse.Namespace(cache=None, size="cpu", repeats=3)
    monkeypatch.setattr(diagnosis, "code_unchanged_since", lambda commit, name: True)
    row = diagnosis.diagnose_workload("segmentation", args, Path("."), earlier)
    assert runs == [("plain", True), ("gpu_boost", False)], "only the applied advice and GPUBoost() ran"
    assert row["plain_samples_per_s"] == [11.7, 9.6, 9.4] and row["kept_stages"]["git_commit"] == "a" * 40
    assert row["applied"]["predicted_gain"] == 3.0 and abs(row["applied"]["measured_gain"] - 30.0 / 9.6) < 1e-9
    monkeypatch.setattr(diagnosis, "code_unchanged_since", lambda commit, name: False)
    with pytest.raises(ValueError, match="changed since"):
        diagnosis.diagnose_workload("segmentation", args, Path("."), earlier)
    # --accept-changes REASON: goes on, the reason and the files that changed recorded in the row
    monkeypatch.setattr(diagnosis, "changed_since", lambda commit, name: ["lightning_gpu_boost/doctor.py"])
    args.accept_changes = "a figure added beside the prediction"
    row = diagnosis.diagnose_workload("segmentation", args, Path("."), earlier)
    assert row["kept_stages"]["code_unchanged_since"] is False
    assert row["kept_stages"]["changes_accepted"] == {"reason": "a figure added beside the prediction",
                                                      "files": ["lightning_gpu_boost/doctor.py"]}  # fmt: skip
    monkeypatch.undo()
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=WORKLOADS.parent.parent)
    if head.returncode == 0:  # a checkout with its history: HEAD is unchanged since itself
        assert diagnosis.code_unchanged_since(head.stdout.strip(), "segmentation") is True
    assert diagnosis.code_unchanged_since(None, "segmentation") is None


def test_the_diagnosis_predicts_a_worker_count_by_doctors_gain_on_the_plain_fits_rate(monkeypatch):
    """doctor's short fits share a bias at both counts (photos_hr on the H100: 25.6/s at 4 workers where the plain
    fits read 18.4-23.3/s); the gain its advice quotes, on the rate the project's own fit measured, cancels it."""
    spec = importlib.util.spec_from_file_location("diagnosis", WORKLOADS.parent / "diagnosis.py")
    diagnosis = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diagnosis)
    found = {"fit_samples_per_s": {4: 25.6, 16: 93.7}, "num_workers": 4, "tuned_workers": 16,
             "loader_samples_per_s": 20.9}  # fmt: skip
    monkeypatch.setattr(diagnosis.RUNNER, "doctor", lambda *a, **k: {"diagnosis": found})
    rate, source, loader = diagnosis.predicted("photos_hr", "AutoNumWorkers()", {"throughput": {"samples_per_s": 19.4}},
                                               "cpu", Path("."))  # fmt: skip
    assert abs(rate - 19.4 * 93.7 / 25.6) < 1e-9 and "gain (3.66x, num_workers=4 -> 16)" in source
    assert loader["doctor_fit_at_current"] == 25.6 and loader["doctor_fit_at_advised"] == 93.7
    found["fit_samples_per_s"] = {16: 93.7}  # no fit at the current count: its fit at the advised one
    assert diagnosis.predicted("photos_hr", "num_workers=16", {"throughput": {"samples_per_s": 19.4}}, "cpu",
                               Path("."))[:2] == (93.7, "doctor's short fit at num_workers=16")  # fmt: skip


def test_the_meter_opens_a_fresh_window_in_the_next_epoch_where_an_epoch_ended_an_unsteady_one():
    """A window never holds an epoch's restart: where an epoch ends with its window unsteady, the next epoch gets a
    fresh one (after its warm-up), and the summary is the steadiest window's."""
    # epoch 1: fast steps, then a slow tail (no start gives agreeing halves); 2: even
    phased = Sleeping(60, lambda call: 0.03 if call <= 48 else 0.15 if call <= 60 else 0.06)
    summary, _ = meter_fit(phased, max_epochs=RUNNER.EPOCH_WINDOWS + 2)
    assert summary["epoch_windows"] == 2 and summary["steady"] and summary["halves_diff"] <= 0.05, summary
    assert 40 < summary["samples_per_s"] < 75, summary  # epoch 2's pace: 4 samples each 60 ms


def test_the_diagnosis_cache_keeps_each_stage_under_the_commit(tmp_path, monkeypatch):
    """--cache: a stage's result is kept as it ends and read back by the next run at the same commit (a GPU call's
    time limit cut the workload short), never at another commit; without a cache every stage runs."""
    spec = importlib.util.spec_from_file_location("diagnosis", WORKLOADS.parent / "diagnosis.py")
    diagnosis = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diagnosis)
    calls: list[int] = []

    def fit(rate: int) -> dict:
        calls.append(rate)
        return {"throughput": {"samples_per_s": rate}, "fits": {4: 1.0}}  # int keys survive (pickled)

    monkeypatch.setenv("GIT_COMMIT", "a" * 40)
    once = diagnosis._once_under(str(tmp_path), "segmentation", "gpu")
    assert once("plain-0", fit, 7) == {"throughput": {"samples_per_s": 7}, "fits": {4: 1.0}} and calls == [7]
    assert once("plain-0", fit, 8)["throughput"]["samples_per_s"] == 7 and calls == [7]  # read back, not run
    assert once.read == ["plain-0"]  # the stage read back is recorded
    monkeypatch.setenv("GIT_COMMIT", "b" * 40)
    once = diagnosis._once_under(str(tmp_path), "segmentation", "gpu")  # the next run, at another commit
    assert once("plain-0", fit, 9)["throughput"]["samples_per_s"] == 9 and calls == [7, 9]  # another commit: runs
    assert diagnosis._once_under(None, "segmentation", "gpu")("plain-0", fit, 10)["fits"] == {4: 1.0}
    assert calls == [7, 9, 10]


def test_the_meter_times_across_the_end_of_an_epoch_too_short_for_a_window():
    """Epochs of 10 steps cannot hold a window of their own: it runs on across their ends, as before, and the
    summary is a timed window (not an empty one)."""
    summary, _ = meter_fit(Sleeping(10, 0.02), max_epochs=4)
    # more steps than an epoch holds: the window ran on across an epoch's end (how many depends on the machine's
    # load: the window's start moves later where its halves differ)
    assert summary["epoch_windows"] == 1 and summary["steps"] > 10 and summary["samples_per_s"] > 0, summary


def test_the_meter_times_whole_epochs_where_a_loader_with_workers_has_no_steady_window():
    """A loader whose workers start every epoch's batches in waves (2 workers, 12 batches an epoch; started again,
    or kept: persistent) leaves no steady window after its queue: whole epochs are timed from the next one, their
    starts included; a change one of our parts made in training (the run record) starts the timed epochs again."""
    import lightning.pytorch as pl

    from lightning_gpu_boost.core.run_record import run_record

    class Change(pl.Callback):  # AutoNumWorkers deciding its count again at the end of epoch 1
        def on_train_epoch_end(self, trainer, pl_module) -> None:
            if trainer.current_epoch == 1:
                run_record(trainer).changes.append({"setting": "num_workers", "from": 2, "to": 2})

    for change, first_timed, persistent in (False, 1, False), (True, 2, False), (False, 1, True):
        summary, trainer = meter_fit(Sleeping(12, 0.25), max_epochs=8, num_workers=2,
                                     callbacks=(Change(),) if change else (), persistent=persistent)  # fmt: skip
        n = summary["epochs_timed"]  # 2 where their halves agree; up to 4 on a loaded machine
        assert summary["measured"] == "whole epochs" and 2 <= n <= RUNNER.MAX_WHOLE_EPOCHS, summary
        assert summary["steady"] or n == RUNNER.MAX_WHOLE_EPOCHS, summary
        assert summary["steps"] == 12 * n and 5 < summary["samples_per_s"] < 40, summary  # 2 workers: <= 32/s
        assert trainer.current_epoch == first_timed + n, "stopped at the last timed epoch's end"
