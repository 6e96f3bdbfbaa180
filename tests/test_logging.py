"""node_info: what a node decides for its own CPUs is logged once per node, on its first process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lightning_gpu_boost import _logging
from lightning_gpu_boost._logging import node_info


@pytest.fixture
def logged(monkeypatch):
    """The messages node_info hands to Lightning's logger (Lightning may stop it propagating to pytest's)."""
    messages: list[str] = []
    monkeypatch.setattr(_logging, "_log", SimpleNamespace(info=messages.append))
    return messages


def test_one_message_per_node_with_its_rank(logged):
    ranks = [SimpleNamespace(local_rank=local, node_rank=node, num_nodes=2) for node in (0, 1) for local in (0, 1)]
    said = [node_info(t, "AutoNumWorkers: train num_workers=7") for t in ranks]
    assert said == [True, False, True, False]
    assert logged == ["[node 0] AutoNumWorkers: train num_workers=7", "[node 1] AutoNumWorkers: train num_workers=7"]


def test_a_single_node_or_no_trainer_logs_without_a_prefix(logged):
    assert node_info(SimpleNamespace(local_rank=0, node_rank=0, num_nodes=1), "one node")
    assert node_info(None, "no trainer")
    assert logged == ["one node", "no trainer"]
