"""Resumable loaders (``core/resume.py``): the place saved with its epoch, applied only to that epoch, skipping
without loading; per-rank states. The whole-run harness over every loader is ``tests/test_resume.py``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, DistributedSampler

from lightning_gpu_boost.core.resume import ResumableDataLoader, gather_ranks, own_rank


class Loads(Dataset):
    def __init__(self) -> None:
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        self.loaded.append(i)
        return i


def _loader(dataset: Dataset) -> ResumableDataLoader:
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=3)
    return ResumableDataLoader(dataset, batch_size=3, sampler=sampler)


def test_a_resumed_epoch_continues_the_same_order_and_loads_nothing_twice():
    first = _loader(Loads())
    first.sampler.set_epoch(1)
    it = iter(first)
    done = [next(it).tolist() for _ in range(2)]
    state = first.state_dict()
    rest_uninterrupted = [b.tolist() for b in it]
    assert (state["version"], state["epoch"], state["batches"]) == (1, 1, 2)
    assert state["settings"] == {"batch_size": 3, "drop_last": False, "sampler": "DistributedSampler", "samples": 12,
                                 "batches": 4, "num_replicas": 1, "seed": 3}
    data = Loads()
    resumed = _loader(data)
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(1)
    assert [b.tolist() for b in resumed] == rest_uninterrupted
    assert sorted(data.loaded) == sorted(i for b in rest_uninterrupted for i in b)  # the done batches never loaded
    assert [b.tolist() for b in resumed] != [] and done  # the next iteration is a whole epoch again


def test_a_place_of_another_epoch_or_at_its_end_starts_the_epoch_whole():
    for state in ({"epoch": 0, "batches": 2}, {"epoch": 1, "batches": 4}):
        loader = _loader(Loads())
        loader.load_state_dict(state)
        loader.sampler.set_epoch(1)
        assert len(list(loader)) == 4


def test_one_process_states_are_their_own_rank():
    state = {"epoch": 0, "batches": 1}
    assert gather_ranks(state) is state and own_rank(state) is state
    assert own_rank({"ranks": [state, {"epoch": 0, "batches": 2}]}) == state
    assert torch.distributed.is_available()


def test_a_loader_state_saved_at_an_epochs_last_batch_is_marked_finished():
    """torchdata's state at an epoch's last batch says its iterator is not finished: resumed as it is, the next
    epoch would be its empty remainder."""
    from lightning_gpu_boost._lightning import finish_ended_epoch

    def checkpoint(last: bool) -> dict:
        return {"loops": {"fit_loop": {"epoch_loop.batch_progress": {"is_last_batch": last},
                                       "state_dict": {"combined_loader": [{"_iterator_finished": False}, {"epoch": 0}]}}}}  # fmt: skip

    at_end, mid = checkpoint(True), checkpoint(False)
    assert finish_ended_epoch(at_end) == 1 and finish_ended_epoch(mid) == 0
    assert at_end["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"_iterator_finished": True}, {"epoch": 0}]
    assert mid["loops"]["fit_loop"]["state_dict"]["combined_loader"][0] == {"_iterator_finished": False}
    assert finish_ended_epoch({}) == 0


def test_a_place_saved_with_other_settings_is_refused_naming_the_setting_and_both_values():
    first = _loader(Loads())
    it = iter(first)
    next(it)
    state = first.state_dict()
    other = ResumableDataLoader(Loads(), batch_size=4, sampler=DistributedSampler(Loads(), 1, 0, seed=3))
    with pytest.raises(ValueError, match=r"saved with batch_size=3 and this run has batch_size=4"):
        other.load_state_dict(state)
    reseeded = ResumableDataLoader(Loads(), batch_size=3, sampler=DistributedSampler(Loads(), 1, 0, seed=4))
    with pytest.raises(ValueError, match=r"seed=3 and this run has seed=4"):
        reseeded.load_state_dict(state)
    with pytest.raises(ValueError, match=r"version 7; this lightning-gpu-boost reads versions up to 1"):
        _loader(Loads()).load_state_dict({**state, "version": 7})
    _loader(Loads()).load_state_dict({"epoch": 0, "batches": 1})  # a place saved before places had settings
