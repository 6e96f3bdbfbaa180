"""The bad-sample core (``core/bad_samples.py``): every broken kind fails the structure check and unusual images
pass; BadSampleLog warns once per pass."""

from __future__ import annotations

import os

from lightning_gpu_boost.core.bad_samples import (
    BROKEN_KINDS,
    add_unusual_images,
    check_image,
)


class _Owner:
    """A source that skipped samples 3 and 7 of 10: a real BadSampleTracker and their paths."""

    def __init__(self) -> None:
        from lightning_gpu_boost.core.bad_samples import BadSampleTracker

        self.bad_sample_tracker = BadSampleTracker(10)

    def sample_path(self, index: int) -> str:
        return f"class_a/{index}.jpg"


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


def test_a_jpeg_cut_anywhere_in_its_headers_or_before_its_end_marker_fails(broken_tree):
    root, _ = broken_tree
    folder = os.path.join(root, "class_000")
    jpeg = open(os.path.join(folder, sorted(os.listdir(folder))[-1]), "rb").read()
    scan = jpeg.index(b"\xff\xda")
    for cut in [*range(3, scan + 4), len(jpeg) - 2, len(jpeg) - 1]:
        assert check_image(jpeg[:cut]) is not None, cut
        assert check_image(memoryview(bytearray(jpeg[:cut]))) is not None, cut  # as pack reads it
    fill = jpeg[:2] + b"\xff\xff" + jpeg[2:]  # fill bytes before a marker are allowed
    assert check_image(jpeg) is None and check_image(fill) is None


def test_the_quick_jpeg_walk_says_what_the_careful_walk_says_for_any_damaged_header(broken_tree):
    """The structure check walks the usual segments quickly and hands anything unusual to the careful walk: with
    any header byte set to each of a few values, or a cut anywhere, both say the same."""
    import random

    from lightning_gpu_boost.core.bad_samples import _jpeg_problem, _jpeg_walk

    root, _ = broken_tree
    folder = os.path.join(root, "class_000")
    jpeg = open(os.path.join(folder, sorted(os.listdir(folder))[-1]), "rb").read()
    scan = jpeg.index(b"\xff\xda") + 14
    rng = random.Random(0)
    cases = [jpeg, jpeg[:2] + b"\xff\xff" + jpeg[2:], jpeg[:2] + b"\xff\xd0" + jpeg[2:]]
    cases += [jpeg[:cut] for cut in range(2, scan)]
    for at in range(2, scan):
        for value in (0x00, 0x01, 0xD0, 0xD9, 0xDA, 0xFF, rng.randrange(256)):
            cases.append(jpeg[:at] + bytes([value]) + jpeg[at + 1 :])
    for data in cases:
        assert _jpeg_problem(data) == _jpeg_walk(data, 2, False), data[:scan]
