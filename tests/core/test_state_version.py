"""Versioned states (``core/state_version.py``): every ``state_dict`` of ours carries a version, and a state from a
newer package is refused naming the owner and both versions."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from lightning_gpu_boost.callbacks import AutoNumWorkers, GPUBoost, GPUUtilWatchdog
from lightning_gpu_boost.core.block_shuffle import BlockShuffleSampler
from lightning_gpu_boost.core.resume import ResumableDataLoader
from lightning_gpu_boost.core.spanning import SpanningLoader
from lightning_gpu_boost.core.state_version import check_state_version
from tests.helpers import IndexDataset


def _owners():
    data = IndexDataset(16)
    return {
        "GPUBoost": GPUBoost(),
        "AutoNumWorkers": AutoNumWorkers(),
        "GPUUtilWatchdog": GPUUtilWatchdog(),
        "BlockShuffleSampler": BlockShuffleSampler(data, block_size=4, window_blocks=2, seed=1),
        "ResumableDataLoader": ResumableDataLoader(data, batch_size=4),
        "SpanningLoader": SpanningLoader(DataLoader(data, batch_size=4), span=False),
    }


@pytest.mark.parametrize("name", list(_owners()))
def test_every_state_carries_a_version_and_a_newer_one_is_refused(name):
    owner = _owners()[name]
    save, load = ((owner.boost_state, owner.load_boost_state) if name == "GPUBoost"
                  else (owner.state_dict, owner.load_state_dict))  # fmt: skip
    state = save()
    assert isinstance(state.get("version"), int) and state["version"] >= 1, state
    load(dict(state))  # its own state reads back
    with pytest.raises(ValueError, match=r"version 99"):
        load({**state, "version": 99})


def test_a_state_without_a_version_reads_as_version_0():
    assert check_state_version("Thing", {"epoch": 1}, 1) == 0
    with pytest.raises(ValueError, match=r"Thing: the checkpoint holds its state in version 'x'"):
        check_state_version("Thing", {"version": "x"}, 1)
