"""node_info: what a node decides for its own CPUs is logged once per node, on its first process."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from lightning_gpu_boost._logging import node_info


def test_one_message_per_node_with_its_rank(caplog):
    caplog.set_level(logging.INFO)
    ranks = [SimpleNamespace(local_rank=local, node_rank=node, num_nodes=2) for node in (0, 1) for local in (0, 1)]
    logged = [node_info(t, "AutoNumWorkers: train num_workers=7") for t in ranks]
    assert logged == [True, False, True, False]
    assert [r.getMessage() for r in caplog.records] == ["[node 0] AutoNumWorkers: train num_workers=7",
                                                        "[node 1] AutoNumWorkers: train num_workers=7"]  # fmt: skip


def test_a_single_node_or_no_trainer_logs_without_a_prefix(caplog):
    caplog.set_level(logging.INFO)
    assert node_info(SimpleNamespace(local_rank=0, node_rank=0, num_nodes=1), "one node")
    assert node_info(None, "no trainer")
    assert [r.getMessage() for r in caplog.records] == ["one node", "no trainer"]
