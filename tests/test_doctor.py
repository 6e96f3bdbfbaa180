"""diagnose(): the bottleneck of constructed loader-, compute- and copy-bound cases."""

from __future__ import annotations

import pytest
import torch

from lightning_gpu_boost.doctor import Diagnosis, diagnose
from tests.helpers import Sleeping, VectorDataModule, VectorModel


def test_a_slow_loader_is_the_bottleneck():
    lines: list[str] = []
    d = diagnose(VectorDataModule(delay_s=0.004), VectorModel(), budget_s=6, steps=5, progress=lines.append,
                 accelerator="cpu")  # fmt: skip
    assert d.bottleneck == "loader", d.format()
    assert d.num_workers == 0 and d.tuned_workers and d.tuned_workers > 0
    assert d.tuned_samples_per_s > 1.5 * d.loader_samples_per_s  # sleeping samples: workers help
    assert 120 < d.loader_samples_per_s < 260  # 4 ms per sample in the main process: at most 250 samples/s
    assert f"set num_workers={d.tuned_workers}" in d.advice[0]
    assert any("searching the worker count" in line for line in lines)
    assert "no CUDA device" in d.format() or d.copy_ms is not None
    # the expected effect is what short fits of the model measured at both counts, the way training sees it
    fits = d.fit_samples_per_s
    assert set(fits) == {0, d.tuned_workers} and fits[d.tuned_workers] > 1.5 * fits[0], d.format()
    # 8 batches an epoch: at the tuned count, as AutoNumWorkers() applies it (workers kept between epochs), each
    # epoch's start costs, so that fit runs over the loader's own whole epochs (not an endless clone's window, which
    # has no epoch to start), as the run pays them; the advice names the persistence the fit ran with
    assert d.fit_timed == {0: "steps", d.tuned_workers: "whole epochs"}, d.format()
    assert f"short fit of the model, over whole epochs) at num_workers={d.tuned_workers}" in d.format()
    assert f"set num_workers={d.tuned_workers}, persistent_workers=True (or add AutoNumWorkers())" in d.advice[0]
    assert "short fits of the model measured" in d.advice[0] and "training (a short fit" in d.format()
    # without the loader's queue to play with, the fit at 0 workers runs at the loader's pace (4 ms a sample)
    assert 0.7 < fits[0] / d.loader_samples_per_s < 1.3, (fits, d.loader_samples_per_s)
    # that fit ran at the loader's pace (far below the step's): it is the loader's figure in training's conditions
    assert d.loader_in_training_samples_per_s == fits[0], d.format()
    assert "loader in training at num_workers=0" in d.format()
    assert d.as_dict()["loader_in_training_samples_per_s"] == fits[0]


def test_the_loader_in_training_is_a_short_fit_that_ran_at_the_loaders_pace():
    """A short fit at the current count is the loader's figure in training only where it ran well below what the
    step and the copy allow; a fit near that bound says nothing about the loader."""
    d = Diagnosis("cpu", batch_size=32, num_workers=4, loader_samples_per_s=900.0, step_ms=10.0, copy_ms=0.0)
    assert d.loader_in_training_samples_per_s is None  # no fit
    d.fit_samples_per_s = {4: 1000.0, 8: 1900.0}
    assert d.loader_in_training_samples_per_s == 1000.0  # the step allows 3,200/s: the loader set the pace
    d.fit_samples_per_s = {4: 3000.0}
    assert d.loader_in_training_samples_per_s is None  # near the step's pace
    d.copy_ms = 10.0
    assert d.loader_in_training_samples_per_s is None  # the copy halves what is allowed: 1,600/s
    assert "loader in training" not in d.format()


def test_trials_can_be_turned_off():
    d = diagnose(VectorDataModule(delay_s=0.004), VectorModel(), budget_s=4, steps=5, trials=False,
                 accelerator="cpu")  # fmt: skip
    assert d.fit_samples_per_s == {} and "short fits" not in d.format()


def test_the_worker_search_is_the_one_auto_num_workers_applies(tmp_path):
    """One voice: the count the doctor advises (and whose effect its fits measure) is the count AutoNumWorkers()
    then applies, from the same search kept in its cache, not a search of its own that noise can land elsewhere."""
    from lightning_gpu_boost.core.workers_cache import loader_fingerprint, read_cache

    data = VectorDataModule(delay_s=0.004)
    cache = tmp_path / "num_workers.json"
    # 6 s: under CI's load a 4 s budget once timed only one count, and the search then kept the user's 0
    d = diagnose(data, budget_s=6, trials=False, accelerator="cpu", cache_path=str(cache))
    data.setup("fit")
    kept = read_cache(cache, loader_fingerprint(data.train_dataloader(), 1))
    assert kept is not None and kept.num_workers == d.tuned_workers > 0
    lines: list[str] = []
    again = diagnose(data, budget_s=4, trials=False, accelerator="cpu", cache_path=str(cache), progress=lines.append)
    assert again.tuned_workers == d.tuned_workers
    assert any("from AutoNumWorkers' cache" in line for line in lines), lines
    fresh = tmp_path / "unused.json"
    diagnose(data, budget_s=2, trials=False, accelerator="cpu", use_cache=False, cache_path=str(fresh))
    assert not fresh.exists()


def test_a_heavy_step_is_the_bottleneck():
    d = diagnose(VectorDataModule(), VectorModel(work=40), budget_s=4, steps=5, tune=False, accelerator="cpu")
    assert d.bottleneck == "compute", d.format()
    assert d.step_ms > 1000 * 32 / d.loader_samples_per_s
    assert "mixed precision" in d.advice[0]


def test_without_a_model_the_data_side_is_reported():
    d = diagnose(VectorDataModule(), budget_s=2, tune=False, accelerator="cpu")
    assert d.bottleneck == "unknown" and d.step_ms is None
    assert "no model given" in d.format()


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="budget_s must be > 0 seconds, got 0"):
        diagnose(VectorDataModule(), budget_s=0)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        diagnose(VectorDataModule(), steps=0)


def test_conclusions_from_figures():
    from lightning_gpu_boost.doctor import _conclude

    copy_bound = Diagnosis("cuda:0", 256, 16, loader_samples_per_s=50_000, copy_ms=3.0, step_ms=10.0)
    _conclude(copy_bound)
    assert copy_bound.bottleneck == "copy" and "StreamPrefetch()" in copy_bound.advice[0]
    at_ceiling = Diagnosis("cuda:0", 256, 16, loader_samples_per_s=2_000, tuned_workers=16,
                           tuned_samples_per_s=2_000, copy_ms=1.0, step_ms=64.0)  # fmt: skip
    _conclude(at_ceiling)
    assert at_ceiling.bottleneck == "loader" and "DALIDataModule" in at_ceiling.advice[0]


def test_a_worker_count_whose_short_fits_gain_nothing_is_not_advised_with_or_without_workers():
    """The two loader branches apply one rule: a count whose short fit is not 5 % faster than the current count's is
    not advised (a note says what the fits measured); one that is, is advised with that gain."""
    from lightning_gpu_boost.doctor import _conclude

    for current in (0, 4):  # num_workers=0 (loading between the steps) and a loader with workers
        for fits, advised in (({current: 578.0, 16: 587.0}, False), ({current: 578.0, 16: 1_200.0}, True)):
            d = Diagnosis("cuda:0", 32, current, loader_samples_per_s=600.0, tuned_workers=16,
                          tuned_samples_per_s=1_500.0, copy_ms=0.5, step_ms=10.0, fit_samples_per_s=fits)  # fmt: skip
            _conclude(d)
            assert d.bottleneck == "loader", d.format()
            said = " ".join(d.advice)
            assert ("set num_workers=16" in said) is advised, (current, fits, d.advice)
            assert any("not advised" in n for n in d.notes) is not advised, (current, fits, d.notes)
            if advised:
                assert f"{1_200 / 578:.2f}x" in said, said
            else:
                assert "578 -> 587 samples/s: not advised" in " ".join(d.notes), d.notes


class SameBatch:
    """One large CPU batch yielded again and again: loading costs nothing, copying it is the work."""

    def __init__(self, batch, length: int = 1000) -> None:
        self.batch, self.length = batch, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return (self.batch for _ in range(self.length))


class ImageMeanModel(VectorModel):
    """A trivial step on image batches."""

    def training_step(self, batch, batch_idx):
        return batch[0].mean() * self.layer.weight.sum()


@pytest.mark.gpu
def test_huge_batches_on_a_trivial_model_are_copy_bound():
    batch = (torch.randn(32, 3, 512, 512), torch.zeros(32, dtype=torch.long))  # 100 MB, pageable
    d = diagnose(SameBatch(batch), ImageMeanModel(), budget_s=2, steps=5, tune=False)
    assert d.copy_ms is not None and d.bottleneck == "copy", d.format()
    assert "StreamPrefetch()" in d.advice[0]


def test_short_epochs_that_restart_their_workers_are_between_steps():
    """Three batches per epoch from 2 workers that start again every epoch, each worker taking 0.3 s to set up:
    the epoch's start is most of it (persistent workers pay it once)."""
    from torch.utils.data import DataLoader

    from tests.helpers import VectorDataset

    def loader(persistent: bool) -> DataLoader:  # each worker opens something slow first (files, a tokenizer)
        return DataLoader(VectorDataset(48, delay_s=0.002), batch_size=16, num_workers=2,
                          persistent_workers=persistent, worker_init_fn=_slow_worker_init)  # fmt: skip

    short = diagnose(loader(False), VectorModel(), budget_s=4, steps=5, tune=False, accelerator="cpu")
    assert short.bottleneck == "epoch-start" and short.verdict == "between-steps", short.format()
    assert "persistent_workers=True" in short.advice[0] and short.between_frac >= 0.25
    # the advice to span the epochs carries its effect, measured by short fits over whole epochs with and without
    fits = short.span_fit_samples_per_s
    assert fits["spanned"] > 1.5 * fits["plain"], short.format()  # the workers' 0.3 s set-up paid once, not per epoch
    assert f"measured {fits['plain']:,.0f} -> {fits['spanned']:,.0f} samples/s" in short.advice[0], short.advice
    kept = diagnose(loader(True), VectorModel(), budget_s=4, steps=5, tune=False, accelerator="cpu")
    assert kept.between_frac is None and kept.bottleneck != "epoch-start", kept.format()


def test_trial_fits_of_short_restarting_epochs_time_whole_epochs():
    """Three batches per epoch from 2 workers that start again every epoch, 0.3 s each to set up: a trial fit's
    figure holds every timed epoch's start, as the run pays it (photos_hr on the H200: a window of steps measured
    96 samples/s where the run, over whole epochs, made 69)."""
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.doctor import measure_epochs_fit, short_epochs
    from tests.helpers import VectorDataset

    def loader(persistent: bool) -> DataLoader:
        return DataLoader(VectorDataset(48, delay_s=0.002), batch_size=16, num_workers=2,
                          persistent_workers=persistent, worker_init_fn=_slow_worker_init)  # fmt: skip

    # persistent workers too start an epoch's batches only once it begins; without workers there is no such start
    assert short_epochs(loader(False)) and short_epochs(loader(True))
    assert not short_epochs(DataLoader(VectorDataset(48), batch_size=16))
    # 17 waves of 2 workers: a window loses at most one wave in 17, and whole epochs would take three of them
    assert not short_epochs(DataLoader(VectorDataset(34 * 16), batch_size=16, num_workers=2))
    assert short_epochs(DataLoader(VectorDataset(16 * 16), batch_size=16, num_workers=2))  # 8 waves
    fit = measure_epochs_fit(VectorModel(), loader(False), steps=6, accelerator="cpu")
    assert fit["measured"] == "whole epochs" and fit["epochs_timed"] == 2
    assert fit["samples_per_s"] <= 48 / 0.3, fit  # no epoch is faster than its workers' start


def test_validation_every_epoch_counts_as_time_between_steps():
    """Persistent training workers, but each short epoch also runs a validation loader whose workers start again:
    its pass is time outside the steps, which doctor measures where it is given the validation loader."""
    from torch.utils.data import DataLoader

    from tests.helpers import VectorDataset

    train = DataLoader(VectorDataset(48, delay_s=0.002), batch_size=16, num_workers=2, persistent_workers=True)
    val = DataLoader(VectorDataset(64, delay_s=0.002), batch_size=16, num_workers=2,
                     worker_init_fn=_slow_worker_init)  # fmt: skip
    with_val = diagnose(train, VectorModel(), budget_s=4, steps=5, tune=False, accelerator="cpu", val_loader=val,
                        val_batches=2)  # fmt: skip
    assert with_val.val_s is not None and with_val.val_s >= 0.3, with_val.format()
    assert with_val.verdict == "between-steps" and "validation" in with_val.advice[0], with_val.format()
    assert "validation" in with_val.format()
    with pytest.raises(ValueError, match="val_batches must be an int >= 1 or None, got 0"):
        diagnose(train, val_loader=val, val_batches=0)


def _slow_worker_init(worker_id: int) -> None:
    import time

    time.sleep(0.3)


def test_without_workers_loading_between_steps_is_the_bottleneck():
    """num_workers=0: the loader and the step take turns, so a loader faster than the step still holds it back."""
    d = diagnose(VectorDataModule(delay_s=0.0015), VectorModel(work=4), budget_s=4, steps=5, tune=False,
                 accelerator="cpu")  # fmt: skip
    assert d.num_workers == 0 and d.bottleneck == "loader", d.format()
    assert "num_workers=0 loads each batch in the training process" in d.advice[0], d.advice


@pytest.mark.gpu
def test_a_step_that_syncs_and_sleeps_is_host_bound_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import time

    class Syncs(VectorModel):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            loss.item()  # a sync every step, then Python work while the GPU waits
            time.sleep(0.03)
            return loss

    d = diagnose(VectorDataModule(), Syncs(), budget_s=4, steps=10, tune=False)
    assert d.step_gpu_util is not None and d.step_gpu_util < 50, d.format()
    assert d.bottleneck == "host" and d.verdict == "host-bound" and ".item()" in d.advice[0], d.format()


def test_a_trial_fit_of_short_epochs_pays_their_waves():
    """Six batches an epoch from 4 workers (0.3 s a batch, sleeping: no CPU limit) come in two waves, the second
    half empty: at most 10 batches/s over whole epochs, where a window of steps on an endless clone reads up to
    13.3. The trial at another count runs the loader as AutoNumWorkers() applies it (workers kept), or as set by
    hand; at the loader's own count, as it is."""
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.doctor import trial_fit

    loader = DataLoader(Sleeping(6, 0.3), batch_size=None, num_workers=1)
    fit = trial_fit(VectorModel(), loader, 4, steps=8, accelerator="cpu")
    assert fit["measured"] == "whole epochs", fit
    assert fit["samples_per_s"] <= 4 * 10.5, fit  # 4 samples a batch, two waves of 0.3 s per 6-batch epoch
    assert trial_fit(VectorModel(), loader, 4, steps=8, persistent_workers=False, accelerator="cpu")[
        "measured"] == "whole epochs"  # fmt: skip
    assert loader.num_workers == 1 and not loader.persistent_workers  # the project's loader is left as it was
    long_epochs = DataLoader(Sleeping(40, 0.01), batch_size=None, num_workers=1)  # 40 waves: a window
    assert trial_fit(VectorModel(), long_epochs, 1, steps=8, accelerator="cpu")["measured"] == "steps"


def test_a_fit_waits_for_the_next_epoch_when_the_window_would_cross_an_epochs_end():
    """``measure_fit`` leaves an epoch more for a window that waits for the next epoch (the meter keeps a window
    inside one epoch where one holds it): 55 batches an epoch, a queue of 9, a warm-up of 52, 4 steps timed; step 52
    leaves 3 in the epoch, so the window opens after the warm-up counted from the next epoch's start (55 + 13) and
    is timed whole, within the fit's 52 + 2 x 9 + 4 + 3 x 4 steps plus the epoch."""
    import time

    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.doctor.measure import measure_fit

    class SlowStep(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            time.sleep(0.005)
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Limit(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            self.max_steps = trainer.max_steps

    limit = Limit()
    loader = DataLoader(torch.randn(55 * 4, 8), batch_size=4, num_workers=2, prefetch_factor=4)
    summary = measure_fit(SlowStep(), loader, steps=4, warmup=52, callbacks=(limit,), accelerator="cpu")
    assert summary["queue_batches"] == 9 and limit.max_steps == 52 + 2 * 9 + 4 + 3 * 4 + 55
    assert summary["warmup_steps"] >= 55 + 13 and summary["steps"] >= 4, summary
