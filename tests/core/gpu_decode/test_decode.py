"""The GPU decode's records, its decoder run on the CPU, and the split search (no torchvision, no GPU needed)."""

from __future__ import annotations

import io
import math
import time

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, default_collate

from lightning_gpu_boost.core.gpu_decode import (
    BatchDecoder,
    Decision,
    DecoderChoice,
    Record,
    RecordBatch,
    SplitSearch,
    is_records,
)
from lightning_gpu_boost.core.gpu_decode.placement import agreed, workers_rate
from lightning_gpu_boost.core.prefetch import StreamPrefetcher

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _jpeg(w: int = 96, h: int = 80, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 255, w)[None, :, None] * rng.uniform(0.3, 1.0, 3)
    y = np.linspace(0, 255, h)[:, None, None] * rng.uniform(0.3, 1.0, 3)
    pixels = np.clip((x + y) / 2 + rng.normal(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _reference(data: bytes, ops: list[tuple]) -> torch.Tensor:
    """What torchvision's PIL path computes: crop, bilinear resize (PIL), flip; normalized."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    for op in ops:
        if op[0] == "crop":
            _, i, j, h, w = op
            img = img.crop((j, i, j + w, i + h))
        elif op[0] == "resize":
            img = img.resize((op[2], op[1]), Image.BILINEAR)
        else:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
    x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255).permute(2, 0, 1)
    return (x - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)


def _batch(records: list[Record]) -> RecordBatch:
    return default_collate(records)


class _Samples(torch.utils.data.Dataset):
    """Records and labels, as a taken-over dataset's workers hand them over."""

    def __init__(self, n: int = 12) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i % 3 == 0:  # a sample its worker decoded
            return Record(pixels=torch.full((3, 16, 16), i, dtype=torch.uint8)), i
        return Record(jpeg=_jpeg(seed=i), ops=[("crop", 0, 0, 32, 32), ("resize", 16, 16)]), i


def test_records_collate_into_one_batch():
    batch = _batch([Record(pixels=torch.zeros(3, 4, 4, dtype=torch.uint8)),
                    Record(jpeg=b"abc", ops=[("resize", 4, 4)]), Record(jpeg=b"defg", ops=[])])
    assert is_records(batch) and batch.shape == (3,) and len(batch) == 3
    assert batch.pixel_index == [0] and batch.jpeg_index == [1, 2] and batch.pixels.shape == (1, 3, 4, 4)
    assert [bytes(t.numpy()) for t in batch.jpegs()] == [b"abc", b"defg"] and batch.ops[0] == [("resize", 4, 4)]
    images, labels = default_collate([(Record(jpeg=b"x"), 1), (Record(jpeg=b"y"), 2)])
    assert isinstance(images, RecordBatch) and labels.tolist() == [1, 2]
    with pytest.raises(ValueError, match="either pixels or a JPEG"):
        Record()
    assert not is_records([b"abc"]) and not is_records([])


def test_batches_of_records_cross_from_workers_in_shared_memory():
    """Two workers collate records; the batches reach the training process whole, in order, and decode."""
    loader = DataLoader(_Samples(), batch_size=4, num_workers=2)
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    seen = []
    for images, labels in loader:
        assert images.pixels is None or images.pixels.is_shared()
        assert images.jpeg is None or images.jpeg.is_shared()
        decoded = decoder.images(images)
        assert decoded.shape == (4, 3, 16, 16)
        seen += labels.tolist()
        first = labels.tolist().index(next(i for i in labels.tolist() if i % 3 == 0))
        expected = (labels[first] / 255 - torch.tensor(MEAN)) / torch.tensor(STD)
        assert torch.allclose(decoded[first, :, 0, 0], expected.float(), atol=1e-4)
    assert seen == list(range(12))


def test_decoder_matches_the_pil_path_within_the_stated_tolerance():
    """The decoder's crop, antialiased bilinear resize and flip against PIL's (what torchvision's CPU transforms
    run), in 8-bit levels: the tolerance docs/gpu_decode.md states for the steps after the decode."""
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    cases = [(_jpeg(seed=s), ops) for s, ops in enumerate([
        [("crop", 3, 5, 60, 70), ("resize", 32, 32), ("flip",)],  # downscale
        [("crop", 10, 20, 20, 24), ("resize", 32, 32)],  # upscale
        [("resize", 40, 48), ("crop", 4, 8, 32, 32)],  # Resize then CenterCrop
    ])]  # fmt: skip
    records = _batch([Record(jpeg=d, ops=ops) for d, ops in cases])
    images, labels = decoder([records, torch.tensor([0, 1, 2])])
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.float32 and labels.tolist() == [0, 1, 2]
    for k, (data, ops) in enumerate(cases):
        ref = _reference(data, ops)
        levels = ((images[k] - ref) * torch.tensor(STD).view(3, 1, 1) * 255).abs()
        assert levels.mean() <= 0.25 and levels.max() <= 1.01, (k, levels.mean(), levels.max())
    assert decoder.last_share == 1.0 and decoder.decoded_on_cpu_here == 3


def test_a_batch_mixes_worker_decoded_samples_and_jpegs():
    decoder = BatchDecoder(MEAN, STD, device="cpu", dtype="bfloat16", channels_last=True)
    pixels = torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8)
    records = _batch([Record(pixels=pixels), Record(jpeg=_jpeg(), ops=[("crop", 0, 0, 32, 32), ("resize", 16, 16)])])
    images = decoder.images(records)
    assert images.dtype == torch.bfloat16 and images.is_contiguous(memory_format=torch.channels_last)
    expected = (pixels.float() / 255 - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    assert torch.allclose(images[0].float(), expected, atol=0.02)
    assert decoder.last_share == 0.5 and decoder.decoded_by_workers == 1


def test_the_prefetcher_decodes_before_the_transform():
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    records = _batch([Record(jpeg=_jpeg(), ops=[("crop", 0, 0, 32, 32), ("resize", 16, 16)])])
    seen = []

    def transform(batch):
        seen.append(batch[0].shape)
        return batch

    out = list(StreamPrefetcher([[records, torch.tensor([1])]], device="cpu", decode=decoder, transform=transform))
    assert seen == [(1, 3, 16, 16)] and out[0][0].shape == (1, 3, 16, 16)


def _run_search(rate_of, search: SplitSearch | None = None, lag: int = 5):
    """Feed the search batches whose share follows the one set ``lag`` batches earlier, at ``rate_of(share)``."""
    search = search or SplitSearch(window=10, settle=2)
    now, history = 0.0, [0.0] * lag
    for _ in range(2000):
        shown = history[-lag]
        now += 1.0 / rate_of(shown)
        new = search.step(now, shown)
        history.append(new if new is not None else history[-1])
        if search.decision is not None:
            return search
    raise AssertionError("no decision")


def test_the_search_keeps_the_fastest_share():
    # the CPU decode feeds 10 batches/s; the step takes 16 without decoding, 14 decoding every sample on the GPU
    def rate(s):
        return min(10 / (1 - s) if s < 1 else 1e9, 16 - 2 * s)

    search = _run_search(rate)
    split = round(1 - 10 / (14 * 1.1), 2)  # the workers could make 10 % more than the step took at share 1
    assert set(search.decision.rates) == {0.0, 1.0, split}
    assert search.decision.share == split and "faster" not in search.decision.why
    # where the workers just keep up with share 1's rate, the step could go no faster than there
    assert search.decision.rates[split] > rate(round(1 - 10 / 14, 2)) + 1
    assert _run_search(rate, SplitSearch(window=10, settle=2, headroom=0.0)).decision.rates.keys() == {
        0.0, 1.0, round(1 - 10 / 14, 2)}
    # the workers keep 13 of 16 CPUs during a split: their share of each batch is smaller
    kept = _run_search(rate, SplitSearch(window=10, settle=2, worker_cpus=13 / 16))
    assert round(1 - 10 * 13 / 16 / (14 * 1.1), 2) in kept.decision.rates
    with pytest.raises(ValueError, match="worker_cpus must be in"):
        SplitSearch(worker_cpus=0.0)


def test_a_split_that_reads_fast_once_is_timed_again_and_its_slower_window_counts():
    """H200, ResNet-50: the split's first window after share 1 read 16.8 batches/s, the split then trained at 15.6,
    below share 1's 16.2."""
    seen = {"split": 0}

    def rate(s):
        if s == 0.0:
            return 14.0
        if s == 1.0:
            return 16.2
        seen["split"] += 1
        return 16.8 if seen["split"] <= 12 else 15.6  # its first window (and settle) fast, then steady

    search = _run_search(rate)
    split = round(1 - 14.0 / (16.2 * 1.1), 2)
    assert [w["share"] for w in search.decision.windows] == [0.0, 1.0, split, split, 0.0, 1.0]
    assert search.decision.rates[split] == pytest.approx(15.6) and search.decision.share == 1.0


def test_a_split_must_beat_share_1s_better_window():
    """H200, ResNet-50: share 1 read 15.9 batches/s just after the CPU decode's window and 17.6 later; the split read
    17.1 twice, then trained at 15.0 against share 1's 17.0: a split is kept only over share 1's better window."""
    seen = {"whole": 0}

    def rate(s):
        if s == 1.0:
            seen["whole"] += 1
            return 15.9 if seen["whole"] <= 15 else 17.6
        return 14.0 if s == 0.0 else 17.1

    search = _run_search(rate)
    split = round(1 - 14.0 / (15.9 * 1.1), 2)
    assert [w["share"] for w in search.decision.windows] == [0.0, 1.0, split, split, 0.0, 1.0]
    assert search.decision.rates[split] == pytest.approx(17.1) and search.decision.rates[1.0] == pytest.approx(15.9)
    assert search.decision.share == 1.0 and "share 1's better window (17.60)" in search.decision.why


def test_a_split_within_the_margin_of_share_1_is_not_kept():
    search = _run_search(lambda s: {0.0: 10.0, 1.0: 16.0}.get(s, 16.3))  # 2 % over share 1: inside the margin
    assert search.decision.share == 1.0 and len([w for w in search.decision.windows if 0 < w["share"] < 1]) == 2


def test_the_search_keeps_the_cpu_decode_when_nothing_is_faster():
    search = _run_search(lambda s: 10.0 - 2 * s)  # the GPU decode slows the step, the CPU keeps up
    assert search.decision.share == 0.0 and "kept" in search.decision.why and search.decision.rates[1.0] < 10
    within_noise = _run_search(lambda s: 10.0 * (1 + 0.02 * s))  # 2 % faster: inside the margin
    assert within_noise.decision.share == 0.0


def test_the_search_times_a_share_again_after_a_break():
    search = SplitSearch(window=4, settle=1)
    for t in range(3):
        search.step(float(t), 0.0)
    search.restart_window()
    search.step(100.0, 0.0)  # the first batch after the break opens the window
    for t in range(4):
        search.step(101.0 + t, 0.0)
    assert search.rates[0.0] == pytest.approx(1.0)


def test_the_batches_held_ahead_are_not_timed():
    """The loader's queue drains faster than its workers fill it (H200, ResNet-18: the first CPU window read 37.5
    batches/s, its workers made 12.5): the settle covers the batches held ahead, at the start and after a break."""
    held, calls = 32, {"cpu": 0}

    def rate(share):
        if share == 0.0:
            calls["cpu"] += 1
            return 40.0 if calls["cpu"] <= held else 12.0  # the queue, then what the workers make
        return 11.0

    search = _run_search(rate, SplitSearch(window=10, settle=held + 3))
    assert search.decision.share == 0.0 and search.decision.rates[0.0] == pytest.approx(12.0)
    search = SplitSearch(window=4, settle=2)
    for t in range(4):
        search.step(float(t), 0.0)
    search.restart_window()  # validation: the queue fills meanwhile
    for t in range(3):
        search.step(100.0 + t * 0.01, 0.0)  # the queue drains fast: not timed
    for t in range(5):
        search.step(101.02 + t, 0.0)  # then one a second
    assert search.rates[0.0] == pytest.approx(1.0)


def _run_with_a_queue(search: SplitSearch, make, take, held: int = 32, stamped: bool = True) -> SplitSearch:
    """A loader that holds ``held`` batches ahead: batch k is made (at ``make(share)`` batches/s, once batch
    ``k - held`` was taken) under the share set when its task was sent, and taken at ``take(share)`` batches/s
    once made; the search sees each batch's end, share and (``stamped``) when it was made."""
    made, taken, shares = [], [], []
    current = search.share
    for k in range(6000):
        share = current if k >= held else search.share
        shares.append(share)
        start = taken[k - held] if k >= held else -held / make(share)
        made.append(max((made[-1] if made else start) + 1.0 / make(share), start))
        taken.append(max((taken[-1] if taken else 0.0) + 1.0 / take(share), made[k]))
        new = search.step(taken[k], share, made[k] if stamped else None)
        if search.decision is not None:
            return search
        if new is not None:
            current = new
    raise AssertionError("no decision")


def test_a_queue_that_outlasts_the_settle_is_not_timed():
    """The workers make 15 batches/s under the CPU decode, the step takes 18 (H200, ResNet-50): the queue drains for
    ~190 batches, longer than the settle. The window's rate is the workers' (from when the batches were made), and
    the GPU decode (16.4 batches/s, its workers keep up) wins."""
    make = lambda s: 15.0 if s == 0.0 else 100.0  # noqa: E731
    take = lambda s: 18.0 if s == 0.0 else 16.4  # noqa: E731
    search = _run_with_a_queue(SplitSearch(window=24, settle=35), make, take)
    assert search.decision.rates[0.0] == pytest.approx(15.0, rel=0.02)
    assert search.decision.rates[1.0] == pytest.approx(16.4, rel=0.02) and search.decision.share > 0
    unstamped = _run_with_a_queue(SplitSearch(window=24, settle=35), make, take, stamped=False)
    assert unstamped.decision.share == 0.0  # the old reading: the draining queue, 18 batches/s


@pytest.mark.parametrize("first", [5, 15])
def test_workers_that_start_together_are_read_at_their_pace(first):
    """16 workers that started together (the run's start, a share change) finish their batches together, every 1.0
    s: 16 batches/s. The time between a window's first and last batch read 23 batches over 1 s or over 2 s (1.44x
    or 0.72x the pace, as the window falls); each worker's own pace reads 16."""
    made = [(float(k // 16 + 1), k % 16) for k in range(first, first + 24)]
    assert workers_rate(made) == pytest.approx(16.0)
    span = max(t for t, _ in made) - min(t for t, _ in made)
    assert 23 / span in (pytest.approx(23.0), pytest.approx(11.5))
    assert workers_rate([(t, None) for t, _ in made]) == pytest.approx(23 / span)  # unnamed: one worker's
    assert workers_rate([(1.0, 0), (2.0, 1)]) is None


@pytest.mark.parametrize("workers", [6, 12])
def test_a_workers_pace_is_not_read_across_an_epoch_end(workers):
    """A window goes on across an epoch's end (2 x H200 under DDP: 125-batch epochs, every window held one); the
    workers, making 15 batches/s, wait 2 s for the next epoch's work, then start again from worker 0. Read across
    the break, each worker's pace held the wait (7.3 batches/s where the step took 14.9); read between breaks it is
    15, or unknown where no worker made two batches between them (the step's rate then counts)."""
    made = [(k / 15 + (2.0 if k >= 12 else 0.0), (k % 12) % workers, int(k >= 12)) for k in range(24)]
    across = workers_rate([(t, w) for t, w, _ in made])
    assert across is not None and across < 7.5
    between = workers_rate(made)
    assert between is None if workers == 12 else between == pytest.approx(15.0)
    search = SplitSearch(window=24, settle=0)
    search.step(10.0 - 1 / 15, 0.0)  # the first batch that shows the share: settling
    for k, (t, w, _) in enumerate(made[:12]):
        search.step(10.0 + k / 15, 0.0, t, w)
    search.restart_window()
    search.step(100.0, 0.0, 0.0, None)  # the batch after the break: skipped, as the settle
    for k, (t, w, _) in enumerate(made[12:]):
        search.step(100.0 + (k + 1) / 15, 0.0, t, w)
    window = search.windows[0]
    assert window["step_batches_s"] == pytest.approx(15.0)
    assert window["workers_batches_s"] == (0.0 if workers == 12 else pytest.approx(15.0))


def test_the_decision_keeps_each_window():
    search = _run_with_a_queue(SplitSearch(window=24, settle=35), lambda s: 15.0 if s == 0.0 else 100.0,
                               lambda s: 18.0 if s == 0.0 else 16.4)  # fmt: skip
    windows = search.decision.windows
    assert [w["share"] for w in windows][:2] == [0.0, 1.0] and all(w["batches"] == 24 for w in windows)
    assert windows[0]["workers_batches_s"] == pytest.approx(15.0, rel=0.02)
    assert windows[0]["step_batches_s"] > windows[0]["workers_batches_s"]  # the draining queue


def test_batches_say_when_their_worker_made_them():
    loader = DataLoader(_Samples(), batch_size=4, num_workers=2)
    before = time.monotonic()
    stamps = [(images.made_at, images.made_by) for images, _ in loader]
    assert all(before < t < time.monotonic() for t, _ in stamps) and {w for _, w in stamps} == {0, 1}
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    decoder.images(default_collate([Record(pixels=torch.zeros(3, 4, 4, dtype=torch.uint8))]))
    assert decoder.last_made_at is not None and decoder.last_made_by == -1


def test_epochs_too_short_to_time_keep_the_cpu_decode():
    search = SplitSearch(window=4, settle=10, max_breaks=3)
    for epoch in range(4):
        for t in range(5):  # shorter than the settle
            assert search.step(epoch * 10.0 + t, 0.0) is None
        search.restart_window()
    assert search.step(50.0, 0.0) == 0.0
    assert search.decision.share == 0.0 and "epoch ends" in search.decision.why


def test_the_cpu_decode_is_timed_again_before_another_share_wins():
    """The CPU decode's first window opens the run, slower than its steady rate (H200: 7.6 batches/s against 14.7
    later): a GPU share that beats only that first window is not chosen."""
    calls = {"cpu": 0}

    def rate(share):
        if share == 0.0:
            calls["cpu"] += 1
            return 6.0 if calls["cpu"] <= 20 else 12.0  # warming up, then steady
        return 11.0

    search = _run_search(rate)
    assert search.decision.share == 0.0 and search.decision.rates[0.0] == pytest.approx(12.0)


def test_share_1_is_timed_again_and_its_slower_window_counts():
    """A fast host (H200, ResNet-50): the CPU decode trained at 17.4 batches/s steady, the GPU decode at 16.8, but
    their first windows read 16.4 and 17.6. The GPU decode's second window decides: the CPU decode is kept."""
    calls = {0.0: 0, 1.0: 0}

    def rate(share):
        if share in calls:
            calls[share] += 1
            first = calls[share] <= 20
            return (16.4 if first else 17.4) if share == 0.0 else (17.6 if first else 16.8)
        return 15.0  # a split: the workers' decode takes the CPU the step needs

    search = _run_search(rate)
    assert [w["share"] for w in search.decision.windows][-2:] == [0.0, 1.0]
    assert search.decision.rates[1.0] == pytest.approx(16.8) and search.decision.share == 0.0
    faster = _run_search(lambda s: {0.0: 10.0, 1.0: 15.0}.get(s, 12.0))  # where the GPU decode wins, it still does
    assert faster.decision.share == 1.0 and [w["share"] for w in faster.decision.windows][-2:] == [0.0, 1.0]


def test_search_arguments_are_checked():
    with pytest.raises(ValueError, match="window"):
        SplitSearch(window=1)


def test_the_copy_takes_records_as_leaves():
    """The prefetcher's copy passes a batch of records through (it did walk a list of records' bytes one by one:
    minutes per batch on the H200)."""
    records = _batch([Record(jpeg=bytes(70_000)) for _ in range(256)])
    out = StreamPrefetcher([], device="cpu", pin=False)._copy([records, torch.tensor([1])])
    assert out[0] is records


def test_a_batch_says_which_share_its_samples_were_made_under():
    made = lambda share: Record(jpeg=b"x", share=share)  # noqa: E731
    assert default_collate([made(0.5), made(0.5)]).share == 0.5
    assert math.isnan(default_collate([made(0.0), made(1.0)]).share)  # made across a change: not the new share
    assert default_collate([Record(jpeg=b"x")]).share is None


def test_short_epochs_are_timed_across_their_ends():
    """Epochs shorter than a window (a restart after every 5 batches) still decide: the breaks are not counted."""
    search = SplitSearch(window=8, settle=1)
    now = 0.0
    for k in range(400):
        if k % 5 == 0:
            search.restart_window()
            now += 100.0  # an epoch's end: long, and not counted
        now += 1.0 / (10.0 if search.share == 0.0 else 12.0)
        search.step(now, search.share)
        if search.decision is not None:
            break
    assert search.decision is not None and search.decision.share == 1.0
    assert search.decision.rates[0.0] == pytest.approx(10.0) and search.decision.rates[1.0] == pytest.approx(12.0)


def test_a_flipped_samples_weights_are_the_unflipped_rows_reversed():
    """The flip is drawn into the weights (each output pixel's center mirrored): bit for bit the unflipped weights'
    rows in reverse order, the resampling PIL's flip after the resize gives."""
    from lightning_gpu_boost.core.gpu_decode.decode import _axis_weights

    length, resized, offset = torch.tensor([60.0, 20.0, 96.0]), torch.tensor([32.0, 48.0, 32.0]), torch.tensor([0.0, 8.0, 0.0])
    plain = _axis_weights(length, resized, offset, 32, 96)
    flipped = _axis_weights(length, resized, offset, 32, 96, torch.tensor([True, False, True]))
    assert torch.equal(flipped[0], plain[0].flip(0)) and torch.equal(flipped[2], plain[2].flip(0))
    assert torch.equal(flipped[1], plain[1])


def test_ranks_agree_on_a_share_only_where_every_rank_shows_it():
    nan = float("nan")
    assert agreed([[5.0, 1.0, 4.0, 3.0], [6.0, 1.0, 5.0, 2.0]], 0.02) == (5.0, 1.0, 4.0, 3)
    assert agreed([[5.0, 1.0, 4.0, 3.0], [6.0, 0.0, 5.0, 2.0]], 0.02) == (5.0, None, 4.0, 3)
    assert agreed([[5.0, 0.3, nan, nan], [6.0, nan, nan, nan]], 0.02) == (5.0, None, None, None)


def _run_choice(engines: float, cuda: float, lag: int = 4, breaks_every: int = 0) -> DecoderChoice:
    """Feed a DecoderChoice after a search that placed share 1 at ``engines`` batches/s (its slower window):
    batches show the engine load set ``lag`` batches earlier and train at ``cuda`` batches/s with load 0."""
    placed = Decision(1.0, {0.0: 10.0, 1.0: engines - 0.3}, "the GPU decodes 100% of the samples")
    choice = DecoderChoice(placed, engines, window=10, settle=2)
    now, history = 0.0, [1.0] * lag
    assert choice.engine_load == 0.0 and choice.share == 1.0
    for k in range(2000):
        shown = history[-lag]
        now += 1.0 / (cuda if shown == 0.0 else engines)
        if breaks_every and k % breaks_every == 0:
            choice.restart_window()
        new = choice.step(now, shown)
        history.append(new if new is not None else 0.0)
        if choice.decision is not None:
            return choice
    raise AssertionError("no decision")


def test_the_cuda_decoder_is_kept_where_its_slower_window_is_at_least_the_engines():
    """H200, ResNet-50: the engines' images took a conversion kernel each (1.1 ms of a 54 ms step) where
    DALIDataModule's CUDA decoder took 0.8 ms for its whole decode; ResNet-18's faster step needs more JPEGs a
    second than the CUDA decoder makes. The choice is measured like for like (each one's slower window), without a
    margin: both GPU decoders beat the CPU decode by the search's."""
    faster = _run_choice(engines=16.0, cuda=17.0)
    assert faster.decision.engine_load == 0.0 and faster.decision.share == 1.0
    assert "nvJPEG's CUDA decoder decodes in place of the JPEG engines: 1.06x" in faster.decision.why
    assert faster.decision.why.startswith("the GPU decodes 100% of the samples; ")
    timed = [w for w in faster.decision.windows if "engine_load" in w]
    assert len(timed) == 2 and all(w["engine_load"] == 0.0 for w in timed)
    assert faster.decision.rates == {0.0: 10.0, 1.0: 15.7}  # the share's rates, as the search measured them
    close = _run_choice(engines=16.0, cuda=16.3)
    assert close.decision.engine_load == 0.0 and "1.02x" in close.decision.why
    behind = _run_choice(engines=16.0, cuda=15.7)
    assert behind.decision.engine_load == 1.0 and behind.decision.why.endswith(
        "the JPEG engines are kept: nvJPEG's CUDA decoder trained at 0.98x their batches/s (15.70 against 16.00)")
    slower = _run_choice(engines=16.0, cuda=12.0)
    assert slower.decision.engine_load == 1.0 and "0.75x" in slower.decision.why


def test_the_choice_times_only_batches_the_cuda_decoder_decoded_and_keeps_the_engines_without_windows():
    choice = DecoderChoice(Decision(0.7, {0.7: 15.0}, "split"), 15.0, window=4, settle=1)
    for k in range(30):  # the engines' pipelines' batches still arriving: not timed
        assert choice.step(k * 0.1, 1.0) is None
    assert not choice.windows and choice.decision is None
    short = DecoderChoice(Decision(1.0, {1.0: 15.0}, "placed"), 15.0, window=4, settle=1, max_breaks=2)
    for k in range(3):
        short.restart_window()
        short.step(k * 0.1, 0.0)
    assert short.decision.engine_load == 1.0 and "3 epoch ends or validation runs" in short.decision.why
    with pytest.raises(ValueError, match="placed.share must be above 0"):
        DecoderChoice(Decision(0.0, {}, "cpu"), 15.0)
    with pytest.raises(ValueError, match="engines_rate must be above 0"):
        DecoderChoice(Decision(1.0, {}, "gpu"), 0.0)


def test_the_choice_follows_a_decided_search():
    search = _run_search(lambda s: 10.0 if s == 0.0 else 16.0)
    choice = DecoderChoice.after(search)
    assert choice.placed is search.decision and choice.engines_rate == search.decision.rates[1.0]  # the slower
    assert (choice.window, choice.settle, choice.margin) == (search.window, search.settle, search.margin)


def test_the_cuda_decoder_challenges_a_kept_cpu_decode_and_wins_only_by_the_margin():
    """The search kept the CPU decode (17 batches/s, the engines 16.6); the CUDA decoder decoding every sample is
    timed against the CPU decode's better window: placed at 1.06x, the CPU decode standing at 1.02x or where epoch
    ends come before it is timed."""
    search = _run_search(lambda s: 17.0 if s == 0.0 else 16.6)
    assert search.decision.share == 0.0
    for cuda, share in ((18.0, 1.0), (17.3, 0.0)):
        choice = DecoderChoice.against_cpu(search)
        assert choice.share == 1.0 and choice.engines_rate == search.decision.rates[0.0] == pytest.approx(17.0)
        now, history = 0.0, [None] * 4  # the CPU decode's batches (no DALI) until the GPU's arrive
        while choice.decision is None:
            shown = history[-4]
            now += 1.0 / (cuda if shown == 0.0 else 17.0)
            choice.step(now, shown)
            history.append(0.0)
        assert choice.decision.share == share
        assert choice.decision.rates == search.decision.rates
        assert len([w for w in choice.decision.windows if "engine_load" in w]) == 2
        if share:
            assert choice.decision.engine_load == 0.0
            assert choice.decision.why == ("the GPU decodes 100% of the samples; nvJPEG's CUDA decoder decodes them: "
                                           "1.06x the CPU decode's training batches/s (18.00 against 17.00), where "
                                           "the JPEG engines were not 3% faster")  # fmt: skip
        else:
            assert choice.decision.engine_load is None
            assert choice.decision.why.startswith(search.decision.why + "; nvJPEG's CUDA decoder decoding every "
                                                  "sample trained at 1.02x")  # fmt: skip
    untimed = DecoderChoice.against_cpu(search)
    untimed.max_breaks = 2
    for k in range(3):
        untimed.restart_window()
        untimed.step(k * 0.1, 0.0)
    assert untimed.decision.share == 0.0 and "3 epoch ends or validation runs" in untimed.decision.why
    with pytest.raises(ValueError, match="against must be a decision to keep the CPU decode"):
        DecoderChoice(Decision(1.0, {}, "gpu"), 15.0, against=Decision(1.0, {}, "gpu"))
