from __future__ import annotations

import logging
import threading
import time

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_gpu_boost.callbacks import GPUUtilWatchdog
from lightning_gpu_boost.callbacks.gpu_util_watchdog import GPUStarvationError
from lightning_gpu_boost.core import watchdog_report as report
from lightning_gpu_boost.core.verdicts import span_bound
from tests.helpers import IndexDataset, RecordingModel


class Sleepy(IndexDataset):
    def __getitem__(self, i):
        time.sleep(0.004)
        return super().__getitem__(i)


def _fit(trainer_kwargs, watchdog, loader, model=None, **extra):
    model = model or RecordingModel()
    trainer = pl.Trainer(callbacks=[watchdog], max_epochs=1, limit_val_batches=0, **trainer_kwargs, **extra)
    trainer.fit(model, loader)
    return trainer


def _nvml_threads():
    return [t for t in threading.enumerate() if t.name == "gpu-boost-nvml"]


def test_sleepy_dataset_warns_with_a_diagnosis(trainer_kwargs):
    dog = GPUUtilWatchdog(window=5, warmup_steps=2)
    with pytest.warns(UserWarning, match="is starving for data") as record:
        _fit(trainer_kwargs, dog, DataLoader(Sleepy(80), batch_size=4))
    message = next(str(w.message) for w in record if "starving" in str(w.message))
    assert "num_workers=0" in message and "AutoNumWorkers" in message and "batch_size=4" in message
    assert dog.verdict == "data-bound" and dog.warnings[0]["step"] <= 2 + 5 + 1
    assert dog.summaries[0]["data_wait_frac"] > 0.5


def test_advice_follows_a_measured_worker_count(trainer_kwargs):
    """Where AutoNumWorkers already measured the count in use, the watchdog does not advise adding it: it says the
    count was measured and names the per-sample cost (or, where the probe was inconclusive, its budget)."""
    from lightning_gpu_boost.callbacks import AutoNumWorkers
    from lightning_gpu_boost.core.workers import WorkerProbe

    for conclusive, expected in ((True, "was measured as the fastest count"), (False, "raise its budget_s")):
        auto = AutoNumWorkers()
        auto.probes["train"] = WorkerProbe(0, {0: 50.0, 1: 20.0}, 1.0, 1, user_workers=0, conclusive=conclusive,
                                           reason="" if conclusive else "no window fit")  # fmt: skip
        auto.chosen["train"] = 0
        dog = GPUUtilWatchdog(window=5, warmup_steps=2)
        with pytest.warns(UserWarning, match="is starving for data") as record:
            trainer = pl.Trainer(callbacks=[auto, dog], max_epochs=1, limit_val_batches=0, **trainer_kwargs)
            trainer.fit(RecordingModel(), DataLoader(Sleepy(40), batch_size=4))
        message = next(str(w.message) for w in record if "starving" in str(w.message))
        assert expected in message and "add AutoNumWorkers()" not in message, message


def test_in_memory_dataset_does_not_warn(trainer_kwargs, recwarn):
    class Busy(RecordingModel):
        def training_step(self, batch, batch_idx):
            # ~20 ms of compute per step: Lightning's own work between steps (which the host timing counts as
            # waiting) stays far below the threshold even on a loaded 2-core CI machine
            x = torch.randn(256, 256)
            for _ in range(60):
                x = x @ x / 256
            return super().training_step(batch, batch_idx) + 0 * x.sum()

    dog = GPUUtilWatchdog(window=5, warmup_steps=2)
    _fit(
        trainer_kwargs,
        dog,
        DataLoader(TensorDataset(torch.randn(80, 4), torch.arange(80)), batch_size=4),
        Busy(),
    )
    assert not [w for w in recwarn.list if "starving" in str(w.message)]
    assert dog.verdict == "ok" and not dog.warnings


def test_warmup_and_threshold_are_respected(trainer_kwargs):
    # 16 steps: the first window completes only after 10 warm-up + 5 steps
    dog = GPUUtilWatchdog(window=5, warmup_steps=10, on_starvation="ignore")
    _fit(trainer_kwargs, dog, DataLoader(Sleepy(64), batch_size=4))
    assert dog.warnings and all(w["step"] >= 15 for w in dog.warnings)
    strict = GPUUtilWatchdog(window=5, warmup_steps=2, wait_threshold=0.99, on_starvation="ignore")
    _fit(trainer_kwargs, strict, DataLoader(Sleepy(64), batch_size=4))
    assert not strict.warnings


def test_raise_mode_and_no_thread_left(trainer_kwargs):
    dog = GPUUtilWatchdog(window=4, warmup_steps=1, on_starvation="raise")
    with pytest.raises(GPUStarvationError, match="num_workers=0"):
        _fit(trainer_kwargs, dog, DataLoader(Sleepy(64), batch_size=4))
    assert not _nvml_threads()


def test_no_thread_left_when_training_step_raises(trainer_kwargs):
    class Broken(RecordingModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match="boom"):
        _fit(trainer_kwargs, GPUUtilWatchdog(), DataLoader(IndexDataset(32), batch_size=4), Broken())
    assert not _nvml_threads()


def test_timing_only_without_cuda_with_one_info_line(trainer_kwargs, caplog):
    with caplog.at_level(logging.INFO):
        _fit(
            trainer_kwargs,
            GPUUtilWatchdog(window=3, warmup_steps=1),
            DataLoader(IndexDataset(32), batch_size=4),
        )
    assert caplog.text.count("host timings only") == 1
    assert "GPUUtilWatchdog summary" in caplog.text


def test_nvml_absent_is_timing_only(monkeypatch):
    import builtins

    from lightning_gpu_boost.core.nvml import NVMLSampler

    real = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    sampler = NVMLSampler().start()
    assert not sampler.available and "lightning-gpu-boost[nvml]" in sampler.reason and not sampler.running


def test_metrics_are_logged(trainer_kwargs, tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    kwargs = {**trainer_kwargs, "logger": CSVLogger(tmp_path), "log_every_n_steps": 2}
    _fit(kwargs, GPUUtilWatchdog(window=3, warmup_steps=1), DataLoader(Sleepy(48), batch_size=4))
    header = next(tmp_path.rglob("metrics.csv")).read_text().splitlines()[0]
    assert "gpu_boost/data_wait_frac" in header and "gpu_boost/step_ms" in header


def test_plot(trainer_kwargs, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "timeline.png"
    _fit(
        trainer_kwargs,
        GPUUtilWatchdog(window=3, warmup_steps=1, plot_path=str(path)),
        DataLoader(Sleepy(48), batch_size=4),
    )
    assert path.stat().st_size > 1000


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"window": 1}, "window must be an int >= 2, got 1"),
        ({"warmup_steps": -1}, "warmup_steps must be an int >= 0"),
        ({"wait_threshold": 1.5}, r"wait_threshold must be a number in \(0, 1\), got 1.5"),
        ({"util_threshold": 0}, r"util_threshold must be a number in \(0, 100\], got 0"),
        ({"on_starvation": "panic"}, "on_starvation must be one of 'warn', 'raise', 'ignore', got 'panic'"),
        ({"warn_every_n_steps": 0}, "warn_every_n_steps must be an int >= 1"),
        ({"sample_interval_s": 0}, "sample_interval_s must be a number > 0, got 0"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPUUtilWatchdog(**kwargs)


@pytest.mark.gpu
def test_gpu_util_high_when_compute_bound_and_low_when_starved():
    from lightning_gpu_boost.core.nvml import NVMLSampler

    with NVMLSampler(interval=0.05) as sampler:
        x = torch.randn(8192, 8192, device="cuda")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
        busy = sampler.mean_util(since=t0 + 0.5)
        t1 = time.monotonic()
        while time.monotonic() - t1 < 2.0:
            torch.ones(1, device="cuda").sum().item()
            time.sleep(0.05)
        starved = sampler.mean_util(since=t1 + 0.5)
    assert sampler.available and busy is not None and starved is not None
    assert 0 <= starved <= 100 and 0 <= busy <= 100
    assert busy > 80 and starved < 30, (busy, starved)


def test_ddp_summary_shows_every_rank(tmp_path):
    from tests.helpers import run_ddp

    results = run_ddp(
        """
        import lightning.pytorch as pl
        from torch.utils.data import DataLoader
        from lightning_gpu_boost.callbacks import GPUUtilWatchdog
        from tests.callbacks.test_gpu_util_watchdog import Sleepy
        dog = GPUUtilWatchdog(window=3, warmup_steps=1, on_starvation="ignore")
        trainer = pl.Trainer(accelerator="cpu", devices=NPROCS, strategy="ddp", max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[dog])
        trainer.fit(RecordingModel(), DataLoader(Sleepy(64), batch_size=4))
        (OUT / f"rank{trainer.global_rank}.json").write_text(json.dumps({"summaries": dog.summaries}))
        """,
        tmp_path,
    )
    assert len(results[0]["summaries"]) == 2 and results[0] == results[1]
    assert all(s["steps"] == 8 for s in results[0]["summaries"])


def test_short_epochs_that_restart_their_workers_get_the_between_steps_verdict(trainer_kwargs):
    """Epochs of 4 batches, workers that restart every epoch and a validation loader that does the same: most of
    the run passes outside the steps, which the per-step figures leave out; the verdict says so and names spanning
    the epochs first, then persistent_workers."""
    dog = GPUUtilWatchdog(window=2, warmup_steps=0, summary=False)
    train = DataLoader(IndexDataset(16), batch_size=4, num_workers=2)
    val = DataLoader(IndexDataset(8), batch_size=4, num_workers=2)
    with pytest.warns(UserWarning, match="outside the steps"):
        pl.Trainer(callbacks=[dog], max_epochs=4, **trainer_kwargs).fit(RecordingModel(), train, val)
    assert dog.run_verdict == "between-steps", dog.summaries
    assert dog.summaries[0]["between_frac"] >= 0.25 and dog.summaries[0]["validation_frac"] > 0
    text = " ".join(dog.run_advice)
    assert "persistent_workers=True keeps the 2 train workers" in text and "validation loader" in text
    # the later epochs' starts (the workers starting again) are timed: the advice that removes them, spanning the
    # epochs, comes first and states what it gives; persistent workers save only their start-up, said second
    starts = dog.summaries[0]["epoch_start_frac"]
    assert 0 < starts < dog.summaries[0]["between_frac"]
    first, second = dog.run_advice[0], dog.run_advice[1]
    assert "SpanEpochs(min_restart_share=0)" in first, dog.run_advice
    assert f"expect up to {span_bound(report.summary_evidence(dog.summaries[0])):.2f}x" in first
    assert "persistent_workers=True" in second and "saves their start-up" in second


class SyncsEveryStep(pl.LightningModule):
    """A fed step that reads its loss back with .item() and then spends 30 ms in Python (the host-bound loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10))

    def training_step(self, batch, batch_idx):
        loss = self.net(batch[0]).logsumexp(-1).mean()
        if loss.item() > 1e9:  # a sync every step
            print("diverged")
        time.sleep(0.03)  # Python work on the host while the GPU has nothing queued
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.gpu
def test_a_step_that_syncs_and_runs_python_is_host_bound_not_starved():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    data = TensorDataset(torch.randn(64 * 256, 1024))
    dog = GPUUtilWatchdog(window=10, warmup_steps=5)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=60, callbacks=[dog], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    # the batches come from two workers: made in the training process, they were a fifth of each step on a slow
    # machine (9.4 of 34.7 ms: a real wait for data, which this test is not about)
    loader = DataLoader(data, batch_size=256, pin_memory=True, num_workers=2, persistent_workers=True,
                        multiprocessing_context="forkserver")  # forked beside the NVML and pin threads, a worker died
    trainer.fit(SyncsEveryStep(), loader)
    assert dog.verdict == "host-bound" and dog.run_verdict == "host-bound", dog.summaries
    assert not [w for w in dog.warnings if w["verdict"] in ("data-bound", "copy-bound")]
    message = next(w["message"] for w in dog.warnings if w["verdict"] == "host-bound")
    assert ".item()" in message and "num_workers" not in message.split("Next:")[1]


class _ChoosesAllCPUs(pl.Callback):
    """A part of ours that chose a worker count of every usable CPU, recorded in the run record."""

    def __init__(self, cpus: int) -> None:
        self.cpus, self.asked = cpus, []

    def setup(self, trainer, pl_module, stage):
        from lightning_gpu_boost.core.run_record import run_record

        def again(proposal, reason, **evidence):  # evidence: what training measured (training_batches_s)
            self.asked.append((proposal, reason))
            return proposal, f"TestTuner decided again: num_workers {self.cpus} -> {proposal}, because {reason}."

        run_record(trainer).choose("num_workers", self.cpus, by="TestTuner", why="measured", decide_again=again)


@pytest.mark.gpu
def test_a_host_bound_step_asks_the_part_that_chose_the_workers_instead_of_advising_a_count(monkeypatch):
    """One voice: the watchdog never says "set num_workers=15" for a count one of our parts set; it asks the part."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import lightning_gpu_boost.callbacks._run_facts as run_facts_module

    cpus = 2  # the facts see a node of 2 usable CPUs, both given to workers (16 real workers crashed on /dev/shm)
    monkeypatch.setattr(run_facts_module, "usable_cpus", lambda: cpus)
    data = TensorDataset(torch.randn(64 * 256, 1024))
    dog, part = GPUUtilWatchdog(window=10, warmup_steps=5), _ChoosesAllCPUs(cpus)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=60, callbacks=[part, dog], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    loader = DataLoader(data, batch_size=256, pin_memory=True, num_workers=cpus, persistent_workers=True,
                        multiprocessing_context="forkserver")  # forked beside the NVML and pin threads, a worker died
    trainer.fit(SyncsEveryStep(), loader)
    messages = [w["message"] for w in dog.warnings if w["verdict"] == "host-bound"]
    assert messages and part.asked and part.asked[0][0] == cpus - 1, dog.warnings
    assert all("set num_workers" not in m for m in messages)
    assert "TestTuner decided again" in messages[0]


def test_a_host_bound_window_waits_while_the_decode_placement_is_measured(monkeypatch):
    """One voice: while decode="auto" times its shares (2 x H200: windows around its share changes read host-bound,
    and AutoNumWorkers gave up a worker), a host-bound window neither warns nor asks the
    part that chose the worker count; it still marks the window's phase, and once the placement is decided the
    next host-bound window does both."""
    from types import SimpleNamespace

    import lightning_gpu_boost.callbacks.gpu_util_watchdog as watchdog_module
    from lightning_gpu_boost.core.verdicts import RunFacts

    asked: list[str] = []
    monkeypatch.setattr(watchdog_module, "classify", lambda *args: "host-bound")
    monkeypatch.setattr(watchdog_module, "data_path", lambda trainer: None)
    monkeypatch.setattr(report, "ask_again", lambda path, facts, m: asked.append("asked") or "decided again")
    monkeypatch.setattr(report, "host_message", lambda m, facts, decided: f"host-bound; {decided}")
    dog, measuring = GPUUtilWatchdog(), [True]
    monkeypatch.setattr(dog, "facts", lambda trainer, found=None: RunFacts(decode_measuring=measuring[0]))
    trainer = SimpleNamespace(global_step=40)
    m = {"data_wait_frac": 0.01, "step_ms": 60.0, "data_wait_ms": 0.6, "gpu_util": 50.0, "gpu_mem_frac": 0.1}
    assert dog._judge(trainer, m) == "host-bound"
    assert dog.verdict != "host-bound" and not asked and not dog.warnings
    measuring[0] = False
    trainer.global_step = 200
    assert dog._judge(trainer, m) is None
    assert dog.verdict == "host-bound" and asked == ["asked"]
    assert [w["message"] for w in dog.warnings] == ["host-bound; decided again"]


@pytest.mark.gpu
def test_sm_activity_and_mfu_are_logged_and_summarized_on_the_gpu():
    """SM activity from NVML GPM (Hopper and newer; elsewhere the sampler says why) and MFU from one step's counted
    FLOPs over the GPU's peak, beside utilization in the summary."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")

    class Matmuls(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096))

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).float().pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    data = TensorDataset(torch.randn(16384, 4096))
    dog = GPUUtilWatchdog(window=10, warmup_steps=5)
    trainer = pl.Trainer(accelerator="gpu", devices=1, max_steps=200, precision="bf16-mixed", callbacks=[dog],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)  # fmt: skip
    trainer.fit(Matmuls(), DataLoader(data, batch_size=1024, pin_memory=True, num_workers=2, persistent_workers=True,
                                      multiprocessing_context="forkserver"))
    assert dog._peak == 989.4e12 or "H200" not in torch.cuda.get_device_name(0)  # dense bf16 (H100 SXM's cores)
    flops = dog._flops.flops
    # two linears forward, and backward the second's input and weight gradients and the first's weight gradient
    assert flops == 5 * 2 * 1024 * 4096 * 4096
    summary = dog.summaries[0]
    assert 0.0 < summary["mfu"] < 1.0, summary
    sampler = dog._sampler
    if sampler.sm_reason:
        print(f"SM activity not sampled: {sampler.sm_reason}")
        assert summary["sm_active"] != summary["sm_active"]  # NaN
    else:
        assert 0.0 < summary["sm_active"] <= 100.0, summary
    print(f"MFU {summary['mfu']:.3f}, SM active {summary['sm_active']:.1f} %, GPU util {summary['gpu_util']:.0f} %")
    assert "SM active | MFU" in dog.format_summary()
