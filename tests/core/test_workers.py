"""The worker search (``core/workers.py``): counts measured by the budget, probes that rank or keep the user's
value."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lightning_gpu_boost.core import loader_rate, workers
from lightning_gpu_boost.core.workers import tune_num_workers


class CPUHeavy(Dataset):
    """Each sample burns ~4 ms of CPU, like decoding a JPEG."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.perf_counter() + 0.004
        while time.perf_counter() < end:
            pass
        return torch.zeros(8)


class Rows(Dataset):
    """Cheap rows read one by one: a worker's fixed cost per batch dominates small batches, not large ones."""

    def __init__(self, n: int = 120_000) -> None:
        self.x = torch.randn(n, 64)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


class Sleepy(Dataset):
    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.zeros(4)


class DiesInWorkers(Dataset):
    """Loads in the main process; a worker that loads exits at once (as one that touches CUDA after a fork)."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int):
        import os

        if torch.utils.data.get_worker_info() is not None:
            os._exit(3)
        time.sleep(0.001)
        return torch.zeros(4)


def test_cpu_heavy_dataset_gets_workers():
    probe = tune_num_workers(DataLoader(CPUHeavy(), batch_size=8), budget_s=10, max_workers=2)
    assert probe.num_workers > 0, probe.format_table()
    assert set(probe.table) >= {0, 1}


def test_in_memory_dataset_gets_zero():
    probe = tune_num_workers(
        DataLoader(TensorDataset(torch.randn(4096, 8)), batch_size=64), budget_s=10, max_workers=2
    )
    assert probe.num_workers == 0, probe.format_table()


def test_budget_is_respected():
    start = time.perf_counter()
    probe = tune_num_workers(DataLoader(CPUHeavy(), batch_size=32), budget_s=2.0, max_workers=8)
    assert time.perf_counter() - start < 2.0 + 2.5  # the last measurement may start just before the end
    assert probe.elapsed_s < 4.5
    # nothing measured is nothing ranked: the user's value stays, and the probe says why
    assert probe.table or (not probe.conclusive and probe.num_workers == 0 and "keeping" in probe.reason)


def test_explicit_candidates_and_choice_rule():
    probe = tune_num_workers(DataLoader(CPUHeavy(), batch_size=8), budget_s=10, candidates=[1, 2])
    assert set(probe.table) == {1, 2}
    assert workers._choose({0: 10.0, 1: 9.8, 2: 19.0, 4: 19.5}, 0.05) == 2  # smallest within 5 % of the best
    assert workers._choose({0: 100.0, 1: 10.0, 2: 12.0}, 0.05) == 0  # 0 only when clearly fastest
    assert workers._choose({0: 10.5, 1: 10.0}, 0.05) == 1  # similar: workers overlap with the step


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"budget_s": -1}, "budget_s must be a number > 0, got -1"),
        ({"budget_s": "10"}, "budget_s must be a number > 0, got '10'"),
        ({"candidates": []}, "candidates must be a non-empty list"),
        ({"candidates": [2, -1]}, "candidates must be a non-empty list of ints >= 0"),
        ({"tolerance": 1.5}, r"tolerance must be a number in \[0, 1\), got 1.5"),
        ({"max_workers": -2}, "max_workers must be an int >= 0 or None, got -2"),
        ({"max_workers": 2.5}, "max_workers must be an int >= 0 or None, got 2.5"),
        ({"prefetch_factor": 0}, "prefetch_factor must be an int >= 1 or None, got 0"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tune_num_workers(DataLoader(TensorDataset(torch.zeros(4))), **kwargs)


def test_probe_batches_follow_the_sample_cost_and_workers_are_joined():
    """`_shutdown_workers` is private to PyTorch: this fails loudly if it stops joining the workers."""
    import multiprocessing

    before = set(multiprocessing.active_children())  # another test's leftovers are not this one's
    loader = DataLoader(CPUHeavy(), batch_size=128)
    size = loader_rate.probe_batch_size
    assert size(loader, sample_s=1e-6, max_workers=16, cpus=16) == 128  # cheap samples: the real batch size
    assert size(loader, sample_s=0.004, budget_s=60, max_workers=16, cpus=16) == 128  # it fits the budget
    shrunk = size(loader, sample_s=0.004, budget_s=8, max_workers=16, cpus=16)  # it does not: fewer samples ...
    assert 63 <= shrunk < 128  # ... but never less than 0.25 s of work per probe batch
    fit = [loader_rate.measurement_seconds(w, shrunk * 0.004, 2, 1.0, 16) for w in (16, 8, 4)]
    assert sum(fit) <= 8 / 3 or shrunk == 63
    assert size(loader, sample_s=0.5, max_workers=16, cpus=16) == 1  # slow samples: time per sample
    assert 0.003 < loader_rate.sample_seconds(loader) < 0.02
    clone = loader_rate.clone_loader(loader, 2, batch_size=32)
    assert clone.batch_sampler.batch_sampler.batch_size == 32
    assert len([b for _, b in zip(range(40), clone, strict=False)]) == 40, "16 batches an epoch, without end"
    window = loader_rate.measure_loader(clone, 2, cap_s=5, min_window_s=0.1)
    assert window.queue == 4 and window.warmup >= 4 + 4 and window.timed >= 8
    assert not set(multiprocessing.active_children()) - before


class ThreadsSeen(torch.utils.data.Dataset):
    """Records torch's thread count in each fetch."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        self.seen.append(torch.get_num_threads())
        return torch.zeros(2)


def test_sample_cost_is_taken_at_one_thread_as_a_worker_runs():
    """A worker runs torch at one thread: a sample of torch ops timed on the main process's threads reads several
    times cheaper than the workers pay, and the search planned windows too short (segmentation on the H200)."""
    dataset, threads = ThreadsSeen(), torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert loader_rate.sample_seconds(DataLoader(dataset, batch_size=4)) is not None
        assert dataset.seen and set(dataset.seen) == {1}
        assert torch.get_num_threads() == 2, "the caller's thread count is restored"
    finally:
        torch.set_num_threads(threads)


def test_probe_ranks_cheap_rows_at_a_large_batch_by_its_own_windows():
    # Whether the choice matches a separate sweep is a timing claim: benchmarks/auto_num_workers.py measures it
    # on the GPU machine (bar probe_of_sweep_best_min). Here: cheap samples are probed at the real batch size,
    # within the budget, and the choice follows from the probe's own steady windows by the documented rule.
    loader = DataLoader(Rows(), batch_size=4096, shuffle=True)
    probe = tune_num_workers(loader, budget_s=30, max_workers=2)
    assert probe.probe_batch_size == 4096, "cheap samples are probed at the real batch size"
    assert probe.elapsed_s <= 30 and probe.conclusive
    timed = {w: r for w, r in probe.table.items() if r > 0}
    assert len(timed) >= 2 and set(probe.windows) >= set(timed)
    expected = workers._choose(timed, 0.03)
    if expected < probe.user_workers and timed[expected] <= timed[probe.user_workers]:
        expected = probe.user_workers
    assert probe.num_workers == expected, probe.format_table()


def test_slow_samples_are_probed_per_sample_within_the_budget():
    probe = tune_num_workers(DataLoader(Sleepy(0.25), batch_size=32, num_workers=2), budget_s=12, max_workers=4)
    assert probe.probe_batch_size == 1 and probe.elapsed_s <= 12
    assert probe.num_workers == 4, probe.format_table()  # sleeping workers scale past the 2 CPUs


def test_a_probe_that_cannot_rank_keeps_the_users_value():
    probe = tune_num_workers(DataLoader(Sleepy(2.0), batch_size=8, num_workers=3), budget_s=3, max_workers=4)
    assert probe.num_workers == 3 and not probe.conclusive
    assert "keeping num_workers=3" in probe.reason
    # never fewer workers than the user had unless fewer measured faster
    decided = workers._decide({1: 10.0, 3: 10.1}, {}, 0.05, user=3, limit=4, small=None, sample_s=None, elapsed=1)
    assert decided.num_workers == 3 and decided.conclusive
    decided = workers._decide({1: 10.5, 3: 10.1}, {}, 0.05, user=3, limit=4, small=None, sample_s=None, elapsed=1)
    assert decided.num_workers == 1


def test_quick_contenders_get_interleaved_windows_and_slow_ones_one_confirmation():
    """Windows of quick loaders move by +-25 %: the choice, the fastest count and those close to it get two more
    windows each, interleaved; where a measurement is long, only the fastest and the choice get one more."""
    table = {16: 100.0, 12: 98.0, 8: 70.0, 4: 40.0}  # the choice is 12 (within 3 % of 16); 8 is out of reach
    calls: list[int] = []

    def remeasure(w: int) -> bool:
        calls.append(w)
        return True

    workers._confirm(dict(table), 0.03, remeasure, quick=lambda w: True)
    assert calls == [16, 12, 16, 12]
    calls.clear()
    workers._confirm(dict(table), 0.03, remeasure, quick=lambda w: w < 16)
    assert calls == [16, 12]
    calls.clear()
    workers._confirm(dict(table), 0.03, lambda w: calls.append(w) or len(calls) < 2, quick=lambda w: True)
    assert calls == [16, 12]  # a window that does not fit ends the extra passes


def test_workers_that_die_keep_the_users_setting():
    loader = DataLoader(DiesInWorkers(), batch_size=8, num_workers=3)
    probe = workers.tune_num_workers(loader, budget_s=6, max_workers=2)
    assert probe.num_workers == 3 and not probe.conclusive and "died" in probe.reason


def test_a_loader_of_whole_batches_is_probed():
    """The fast-tensor-loader idiom (a BatchSampler as the sampler, batch_size=None) is cloned and probed."""
    from torch.utils.data import BatchSampler, RandomSampler, TensorDataset

    from lightning_gpu_boost.core.loader_rate import clone_loader
    from lightning_gpu_boost.core.workers import tune_num_workers

    dataset = TensorDataset(torch.randn(512, 4), torch.arange(512))
    loader = DataLoader(dataset, sampler=BatchSampler(RandomSampler(dataset), 64, drop_last=False), batch_size=None)
    it = iter(clone_loader(loader, 0))
    x, y = next(it)
    assert x.shape == (64, 4) and len(set(next(it)[1].tolist()) | set(y.tolist())) == 128
    # a generous budget: on a loaded 2-CPU CI machine a worker's start can take seconds, and a count whose
    # measurement no longer fits in the budget is not started (the probe only spends what it needs)
    probe = tune_num_workers(loader, budget_s=60.0, candidates=[0, 1], min_window_s=0.3)
    assert probe.num_workers in (0, 1) and set(probe.table) == {0, 1}, probe


def test_a_worker_count_is_decided_again_only_where_the_probe_measured_it_as_good():
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.core.spanning import SpanningLoader
    from lightning_gpu_boost.core.workers import WorkerProbe, decide_workers_again

    loader = DataLoader(list(range(64)), batch_size=8, num_workers=4)
    probe = WorkerProbe(num_workers=4, table={2: 40.0, 3: 99.0, 4: 100.0})
    applied = []
    value, said = decide_workers_again(probe, loader, 3, "the GPU idles", "Tuner", applied.append)
    assert value == 3 and applied == [3]
    assert said.startswith("Tuner decided again: num_workers 4 -> 3 from the next epoch, because the GPU idles")
    value, said = decide_workers_again(probe, loader, 2, "the GPU idles", "Tuner", applied.append)
    assert value == 4 and applied == [3] and "fewer workers would load slower" in said  # 40 vs 100 batches/s
    value, said = decide_workers_again(None, loader, 3, "the GPU idles", "Tuner", applied.append)
    assert value == 4 and "no probe ran" in said  # inconclusive: the count stays
    spanning = SpanningLoader(loader)  # the data path's record of the loader names it
    value, said = decide_workers_again(probe, loader, 3, "the GPU idles", "Tuner", applied.append, spanning=spanning)
    assert value == 4 and "SpanEpochs" in said and applied == [3]


def test_fewer_workers_are_taken_in_training_where_they_still_outpace_it():
    """Training shows the workers crowd the training process: one worker fewer is taken where the loader alone at
    the current count, less one worker's share, still makes 10 % more batches per second than training takes; a
    SpanningLoader is asked to start its workers again at the next epoch."""
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.core.spanning import SpanningLoader
    from lightning_gpu_boost.core.workers import WorkerProbe, decide_workers_again

    probe = WorkerProbe(num_workers=16, table={8: 50.0, 16: 100.0})  # 15 never measured
    loader = DataLoader(list(range(64)), batch_size=8, num_workers=16)
    applied, restarted = [], []
    value, said = decide_workers_again(probe, loader, 15, "the GPU idles", "Tuner", applied.append,
                                       training_batches_s=90.0)  # fmt: skip
    assert value == 16 and applied == [] and "could make as few as 93.8 batches/s" in said  # 93.75 < 99
    value, said = decide_workers_again(probe, loader, 15, "the GPU idles", "Tuner", applied.append,
                                       training_batches_s=80.0)  # fmt: skip
    assert value == 15 and applied == [15] and "15 make at least 93.8, and training takes 80.0" in said
    spanning = SpanningLoader(loader)
    value, said = decide_workers_again(probe, loader, 15, "the GPU idles", "Tuner", applied.append,
                                       training_batches_s=80.0, spanning=spanning)  # fmt: skip
    assert value == 16 and "a new count would restart them" in said  # no one to start them again
    value, said = decide_workers_again(probe, loader, 15, "the GPU idles", "Tuner", applied.append,
                                       training_batches_s=80.0, restart=restarted.append, spanning=spanning)  # fmt: skip
    assert value == 15 and restarted == [spanning] and said.startswith("Tuner decided again: num_workers 16 -> 15")


def test_a_clone_with_the_loaders_own_epochs():
    """``endless=False``: the loader's length, sampler and persistence at another count (a fit over whole epochs
    times their starts); the default clone is endless (the loader-alone measurements' steady state)."""
    from torch.utils.data import DataLoader

    from tests.helpers import VectorDataset

    loader = DataLoader(VectorDataset(40), batch_size=8, num_workers=2, persistent_workers=True)
    finite = loader_rate.clone_loader(loader, 4, endless=False)
    assert len(finite) == 5 and finite.num_workers == 4 and finite.persistent_workers
    assert finite.batch_sampler is loader.batch_sampler
    assert sum(len(b[1]) for b in finite) == 40
    assert not loader_rate.clone_loader(loader, 0, endless=False).persistent_workers  # no workers to keep
    assert len(loader_rate.clone_loader(loader, 4)) == 2**62
    with pytest.raises(ValueError, match="batch_size must be None where endless=False, got 4"):
        loader_rate.clone_loader(loader, 4, batch_size=4, endless=False)


def test_a_decisive_zero_gets_no_extra_windows():
    """0 workers faster than every worker count by more than windows move (2.5x): no count is timed again."""
    calls: list[int] = []
    workers._confirm({0: 15000.0, 1: 640.0, 2: 760.0}, 0.03, lambda w: calls.append(w) or True, quick=lambda w: True)
    assert calls == []
    assert workers._decisive_zero({0: 1950.0, 2: 760.0}) and not workers._decisive_zero({0: 1800.0, 2: 760.0})
    workers._confirm({0: 1800.0, 1: 640.0, 2: 760.0}, 0.03, lambda w: calls.append(w) or True, quick=lambda w: True)
    assert calls and calls[0] == 2  # 2.4x: the contenders get their windows


def test_a_count_chosen_by_a_rule_says_so():
    """The message matches the table: where 0 workers or a larger count measured faster, the reason names the rule
    (issue 65: "num_workers=1 was measured as the fastest count ... (0: 32.9, 1: 29.4)")."""
    zero = workers._decide({0: 14.0, 1: 11.9}, {}, 0.03, 0, 2, None, None, 1.0)
    assert zero.num_workers == 1 and "0 workers loaded faster alone (14.0 against 11.9" in zero.reason
    close = workers._decide({0: 1.0, 2: 19.0, 4: 19.5}, {}, 0.05, 0, 4, None, None, 1.0)
    assert close.num_workers == 2 and "within 5 % of the fastest (num_workers=4: 19.5 against 19.0" in close.reason
    plain = workers._decide({0: 1.0, 2: 19.0}, {}, 0.05, 0, 2, None, None, 1.0)
    assert plain.num_workers == 2 and plain.reason == ""
