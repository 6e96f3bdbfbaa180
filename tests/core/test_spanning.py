from __future__ import annotations

import os
import time

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from lightning_gpu_boost.core.spanning import SpanningLoader
from tests.helpers import IndexDataset, RecordingModel


class Stamped(Dataset):
    """Sample i -> (i, the worker's pid, when it was loaded)."""

    def __init__(self, n: int, delay: float = 0.0) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return torch.tensor(i), torch.tensor(os.getpid()), torch.tensor(time.time(), dtype=torch.float64)


def test_every_sample_once_per_epoch_and_the_workers_live_across_epochs():
    loader = SpanningLoader(DataLoader(Stamped(20), batch_size=4, shuffle=True, num_workers=2))
    pids = set()
    for _ in range(3):
        epoch = list(loader)
        assert len(epoch) == len(loader) == 5
        assert sorted(torch.cat([b[0] for b in epoch]).tolist()) == list(range(20))
        pids |= set(torch.cat([b[1] for b in epoch]).tolist())
    assert len(pids) == 2, "the workers were started again"
    loader.close()


def test_the_next_epochs_first_batch_is_loaded_before_this_epoch_ends():
    loader = SpanningLoader(DataLoader(Stamped(16, delay=0.01), batch_size=4, num_workers=2))
    first = list(loader)
    time.sleep(0.5)  # the step of the last batch: the workers go on with the next epoch meanwhile
    ended = time.time()
    second = list(loader)
    assert second[0][2].max().item() < ended
    assert [b[0].tolist() for b in first] == [b[0].tolist() for b in second]
    loader.close()


def test_an_epoch_left_early_does_not_leak_into_the_next():
    loader = SpanningLoader(DataLoader(IndexDataset(12), batch_size=2, num_workers=1))
    it = iter(loader)
    assert next(it)[1].tolist() == [0, 1]
    del it
    assert [b[1].tolist() for b in loader][0] == [0, 1]  # the next epoch starts at its own first batch
    loader.close()
    assert len(list(loader)) == 6


def test_batches_per_epoch_loads_only_those_and_repeats_them():
    loader = SpanningLoader(DataLoader(IndexDataset(12), batch_size=2), batches_per_epoch=2)
    assert len(loader) == 2
    assert [[b[1].tolist() for b in loader] for _ in range(3)] == [[[0, 1], [2, 3]]] * 3


def test_batch_size_none_loaders_with_a_batch_sampler_as_sampler():
    from torch.utils.data import BatchSampler, SequentialSampler, TensorDataset

    data = TensorDataset(torch.arange(10))
    loader = SpanningLoader(DataLoader(data, sampler=BatchSampler(SequentialSampler(data), 4, False),
                                       batch_size=None))  # fmt: skip
    assert [[b[0].tolist() for b in loader] for _ in range(2)] == [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]] * 2


def test_a_distributed_sampler_draws_each_epochs_order():
    data = IndexDataset(16)
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=3)
    loader = SpanningLoader(DataLoader(data, batch_size=4, sampler=sampler, num_workers=1))
    got = [[i for b in loader for i in b[1].tolist()] for _ in range(3)]
    expected = []
    for epoch in range(3):
        ref = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=3)
        ref.set_epoch(epoch)
        expected.append(list(ref))
    assert got == expected
    loader.close()
    assert [i for b in loader for i in b[1].tolist()] == (lambda r: (r.set_epoch(3), list(r))[1])(
        DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=3))


def test_lightning_trains_and_validates_through_it(trainer_kwargs):
    model = RecordingModel()
    train = SpanningLoader(DataLoader(IndexDataset(24), batch_size=4, shuffle=True, num_workers=2))
    val = SpanningLoader(DataLoader(IndexDataset(24), batch_size=4, num_workers=2), batches_per_epoch=2)
    trainer = pl.Trainer(max_epochs=3, limit_val_batches=2, num_sanity_val_steps=0, **trainer_kwargs)
    trainer.fit(model, train, val)
    train_ids = model.seen["train"]
    assert len(train_ids) == 18
    for epoch in range(3):
        assert sorted(i for b in train_ids[6 * epoch: 6 * epoch + 6] for i in b) == list(range(24))
    assert model.seen["val"] == [[0, 1, 2, 3], [4, 5, 6, 7]] * 3
    train.close()
    val.close()


@pytest.mark.parametrize(
    ("loader", "batches", "match"),
    [
        ([1, 2, 3], None, "must be a torch.utils.data.DataLoader, got list"),
        (None, 0, "batches_per_epoch"),
        ("iterable", None, "IterableDataset"),
    ],
)
def test_bad_input_is_named(loader, batches, match):
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    if loader is None:
        loader = DataLoader(IndexDataset(4))
    elif loader == "iterable":
        loader = DataLoader(Stream())
    with pytest.raises(ValueError, match=match):
        SpanningLoader(loader, batches)


def test_worker_tuners_reach_the_source_and_its_workers_take_their_choice():
    from lightning_gpu_boost.core.loaders import iter_loaders, set_num_workers, spanned_loaders
    from lightning_gpu_boost.core.prefetch import StreamPrefetcher

    source = DataLoader(Stamped(8), batch_size=2)
    loader = SpanningLoader(source)
    wrapped = StreamPrefetcher(loader, device="cpu")
    assert list(iter_loaders(wrapped)) == [source] and spanned_loaders({"a": [wrapped]}) == {id(source)}
    assert spanned_loaders(DataLoader(Stamped(2))) == set()
    set_num_workers(source, 2)  # what AutoNumWorkers does, before the first epoch
    pids = {p for b in wrapped for p in b[1].tolist()}
    assert len(pids) == 2 and os.getpid() not in pids
    loader.close()


def test_the_watchdog_does_not_ask_a_spanning_loader_for_persistent_workers(trainer_kwargs):
    from lightning_gpu_boost.callbacks import GPUUtilWatchdog

    dog = GPUUtilWatchdog()
    train = SpanningLoader(DataLoader(IndexDataset(16), batch_size=4, num_workers=1))
    val = SpanningLoader(DataLoader(IndexDataset(8), batch_size=4, num_workers=1))
    trainer = pl.Trainer(max_epochs=1, callbacks=[dog], **trainer_kwargs)
    trainer.fit(RecordingModel(), train, val)
    facts = dog.facts(trainer)
    assert facts.num_workers == 1 and facts.persistent_workers is True and facts.val_loaders == [(1, True)]
    assert facts.spans_epochs
    train.close()
    val.close()


def test_short_epoch_advice_names_it_only_where_plain_workers_restart():
    from lightning_gpu_boost.core.verdicts import RunFacts, advise

    plain = " ".join(advise("between-steps", RunFacts(num_workers=4, persistent_workers=False, batches_per_epoch=8)))
    assert "SpanningLoader(DataLoader(...))" in plain
    spanning = " ".join(advise("between-steps", RunFacts(num_workers=4, persistent_workers=True, batches_per_epoch=8,
                                                          spans_epochs=True)))  # fmt: skip
    assert "SpanningLoader" not in spanning and "persistent_workers" not in spanning


def test_the_queue_a_meter_waits_out_is_the_workers_in_flight():
    from lightning_gpu_boost.core.prefetch import StreamPrefetcher
    from lightning_gpu_boost.core.steady import queue_batches

    loader = SpanningLoader(DataLoader(Stamped(8), batch_size=2, num_workers=2, prefetch_factor=3))
    assert queue_batches(loader) == 6 and queue_batches(StreamPrefetcher(loader, device="cpu", depth=1)) >= 6
    assert queue_batches(SpanningLoader(DataLoader(Stamped(8), batch_size=2))) == 0
