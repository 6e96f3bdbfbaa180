"""The run record (``core/run_record.py``): choices by part, decided again once per proposal, one record per
owner."""

from __future__ import annotations

import gc

from lightning_gpu_boost.core.run_record import RunRecord, run_record


def test_a_part_decides_again_once_per_proposal_and_the_change_is_kept():
    asked = []

    def again(proposal, reason):
        asked.append((proposal, reason))
        return proposal, f"now {proposal}"

    record = RunRecord()
    assert record.decide_again("num_workers", 3, "why") is None  # nobody chose it: nothing to ask
    record.choose("num_workers", 4, by="Tuner", why="measured", decide_again=again)
    record.choose("pin_memory", True, by="StreamPrefetch", why="asynchronous copies")
    assert record.chosen_by() == {"num_workers": "Tuner", "pin_memory": "StreamPrefetch"}
    assert record.decide_again("num_workers", 3, "no CPU left") == "now 3"
    assert record.decide_again("num_workers", 3, "no CPU left") == "now 3" and len(asked) == 1  # asked once
    assert record.chosen("num_workers").value == 3
    assert record.changes == [{"setting": "num_workers", "by": "Tuner", "from": 4, "to": 3, "proposal": 3,
                               "reason": "no CPU left", "said": "now 3"}]  # fmt: skip
    assert record.decide_again("pin_memory", False, "why") is None  # a part that cannot decide again


def test_one_record_per_owner_that_lives_with_it():
    class Owner:
        pass

    a, b = Owner(), Owner()
    assert run_record(a) is run_record(a) and run_record(a) is not run_record(b)
    run_record(a).choose("x", 1, by="p", why="w")
    del a
    gc.collect()
    assert not any(r.choices for r in [run_record(b)])
