"""The bad-sample core (``core/bad_samples.py``): every broken kind fails the structure check and unusual images\npass; Refill re-forms full batches of any structure, each sample once, pinned memory kept pinned; BadSampleLog\nwarns once per pass."""

from __future__ import annotations

import os

import pytest
import torch

from lightning_gpu_boost.core.bad_samples import (
    BROKEN_KINDS,
    add_unusual_images,
    check_image,
)


def test_every_broken_kind_fails_the_structure_check_and_good_images_pass(broken_tree, tmp_path):
    root, broken = broken_tree
    assert len(broken) == len(BROKEN_KINDS)
    for rel in broken:
        path = os.path.join(root, rel)
        data = open(path, "rb").read() if os.path.exists(path) else None
        if data is not None:
            assert check_image(data) is not None, rel
    for path in add_unusual_images(tmp_path).values():
        data = open(path, "rb").read()
        assert check_image(data) is None and check_image(data, "decode") is None, path
    jpeg = open(os.path.join(root, "class_000", sorted(os.listdir(os.path.join(root, "class_000")))[-1]), "rb").read()
    assert check_image(jpeg + b"trailer after the end marker") is None  # phone cameras append data


def test_refill_reforms_full_batches_of_any_structure_each_sample_once():
    from collections import namedtuple

    from lightning_gpu_boost.core.bad_samples import (
        BadSample,
        Refill,
        SkipBadCollate,
        batch_layout,
        can_refill,
    )

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
    from lightning_gpu_boost.core.bad_samples import Counted, Refill

    parts = [Counted(torch.arange(k).pin_memory(), k, "B") for k in (3, 4, 4)]
    out = list(Refill(parts, 4, 3))
    assert [len(b) for b in out] == [4, 4, 3] and all(b.is_pinned() for b in out)


class _Owner:
    """A source that skipped samples 3 and 7 of 10: a real BadSampleTracker and their paths."""

    def __init__(self) -> None:
        from lightning_gpu_boost.core.bad_samples import BadSampleTracker

        self.bad_sample_tracker = BadSampleTracker(10)

    def sample_path(self, index: int) -> str:
        return f"class_a/{index}.jpg"


def test_bad_sample_log_warns_once_per_pass_also_when_the_loop_stops_early():
    from lightning_gpu_boost.core.bad_samples import BadSampleLog

    owner, said = _Owner(), []
    log = BadSampleLog(owner, "train", warn=said.append)

    def batches():
        for i in range(10):
            if i in (3, 7):
                owner.bad_sample_tracker.mark(i)
            yield i

    assert list(log.watch(batches(), epoch=2)) == list(range(10))
    assert said == ["Epoch 2: skipped 2 bad train samples (bad_samples='skip'): 'class_a/3.jpg', 'class_a/7.jpg'. "
                    "The next samples took their places; `lightning-gpu-boost pack` leaves such files out and lists "
                    "them."]  # fmt: skip
    assert log.history == [{"stage": "train", "epoch": 2, "skipped": 2, "paths": ["class_a/3.jpg", "class_a/7.jpg"]}]
    it = log.watch(batches())  # a pass the loop leaves after 5 batches (limit_train_batches): ended when dropped
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    assert log.current()[0] == 1
    del it
    assert said[-1].startswith("Skipped 1 bad train samples") and log.history[-1]["skipped"] == 1
    assert list(log.watch(iter(range(3)))) == [0, 1, 2] and len(said) == 2  # a clean pass says nothing
