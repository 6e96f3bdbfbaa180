"""Refill (``core/refill.py``): full batches re-formed from any batch structure, each sample once and in order;
pinned memory stays pinned."""

from __future__ import annotations

import pytest
import torch


def test_refill_reforms_full_batches_of_any_structure_each_sample_once():
    from collections import namedtuple

    from lightning_gpu_boost.core.bad_samples import BadSample, SkipBadCollate
    from lightning_gpu_boost.core.refill import Refill, batch_layout, can_refill

    Pair = namedtuple("Pair", "x y")

    def sample(i):
        return {"x": torch.full((3, 2), float(i)), "id": i, "name": f"s{i}", "pair": Pair(torch.tensor(i), [i])}

    collate = SkipBadCollate(refill=True)
    bad = {3, 4, 5, 6, 7, 8, 9, 21}  # a whole batch and more bad
    batches = [collate([BadSample(i, "p", "r") if i in bad else sample(i) for i in range(j, min(j + 4, 30))])
               for j in range(0, 30, 4)]  # fmt: skip
    assert batches[1].n == 0 and batches[0].n == 3
    out = list(Refill(batches, 4, expected=len(batches)))
    assert len(out) == len(batches) == 8
    ids = [int(i) for b in out for i in b["id"]]
    assert ids == [i for i in range(30) if i not in bad]  # each good sample once, in order
    assert [len(b["id"]) for b in out] == [4, 4, 4, 4, 2, 2, 1, 1]
    for b in out:  # every part of a sample stays with it
        mine = b["id"].tolist()
        assert [int(v) for v in b["x"][:, 0, 0]] == mine == b["pair"].x.tolist() == b["pair"].y[0].tolist()
        assert b["name"] == [f"s{i}" for i in mine] and isinstance(b["pair"], Pair)
    # nothing skipped: the batches pass through untouched
    clean = [collate([sample(i) for i in range(j, j + 4)]) for j in range(0, 16, 4)]
    assert [b is c.batch for b, c in zip(Refill(clean, 4, 4), clean, strict=True)] == [True] * 4
    # three variable-size CHW images in a list: a list of samples, never sliced along channels
    images = [torch.zeros(3, 5 + k, 4) for k in range(3)]
    assert batch_layout(images[:1], images, 3) == "L"
    # padding that depends on the batch cannot be re-formed: short batches go on as they are, with a warning
    assert not can_refill(batch_layout(torch.zeros(1, 5), torch.zeros(3, 9), 3))
    warned = []
    padded = SkipBadCollate(lambda s: torch.nn.utils.rnn.pad_sequence(s, batch_first=True), refill=True)
    seqs = [padded([torch.ones(k + 1) for k in range(j, j + 3)]) for j in (0, 3)]
    seqs[0] = padded([torch.ones(1), BadSample(1, "p", "r"), torch.ones(3)])
    assert [len(b) for b in Refill(seqs, 3, 2, warn=warned.append)] == [2, 3] and len(warned) == 1
    # ... also where a batch's first sample is its longest (it looks cuttable alone): its width differs from the
    # next batch's, so nothing is joined across them
    seqs = [padded([torch.ones(3), BadSample(1, "p", "r"), torch.ones(1)]), padded([torch.ones(2)] * 2 + [torch.ones(1)])]
    warned.clear()
    assert [tuple(b.shape) for b in Refill(seqs, 3, 2, warn=warned.append)] == [(2, 3), (3, 2)] and len(warned) == 1


def test_refill_keeps_pinned_memory_pinned():
    if not torch.cuda.is_available():
        pytest.skip("pinning needs CUDA")
    from lightning_gpu_boost.core.refill import Counted, Refill

    parts = [Counted(torch.arange(k).pin_memory(), k, "B") for k in (3, 4, 4)]
    out = list(Refill(parts, 4, 3))
    assert [len(b) for b in out] == [4, 4, 3] and all(b.is_pinned() for b in out)
