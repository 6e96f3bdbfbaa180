from __future__ import annotations

import dataclasses
import hashlib
from collections import namedtuple

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_gpu_boost.core.prefetch import GPUNormalize, StreamPrefetcher
from tests.helpers import IndexDataset, StatefulLoader, ids

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
Pair = namedtuple("Pair", ["x", "y"])


@dataclasses.dataclass
class Sample:
    x: torch.Tensor
    name: str


class WithTo:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def to(self, device, non_blocking=False):
        return WithTo(self.t.to(device, non_blocking=non_blocking))


def _reference(x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.float64) / 255
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    return (x - mean) / std


def _digest(batch) -> str:
    h = hashlib.sha256()
    for t in batch:
        h.update(t.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def batch_seed_for(seed: int, rank: int, epoch: int, index: int) -> int:
    from lightning_gpu_boost.core.prefetch import batch_seed

    return batch_seed(seed, rank, epoch, index)


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_lookahead_keeps_order_and_length(depth):
    loader = DataLoader(IndexDataset(10), batch_size=3)
    wrapped = StreamPrefetcher(loader, device="cpu", depth=depth)
    assert len(wrapped) == 4
    assert [ids(b) for b in wrapped] == [ids(b) for b in loader]
    assert [ids(b) for b in wrapped] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]  # short last batch, twice


def test_lookahead_depth_is_respected():
    fetched = []

    def gen():
        for i in range(6):
            fetched.append(i)
            yield i

    it = iter(StreamPrefetcher(gen(), device="cpu", depth=2))
    assert next(it) == 0
    assert fetched == [0, 1, 2]


def test_empty_loader():
    assert list(StreamPrefetcher([], device="cpu")) == []


def test_structures_survive():
    batches = [
        {"x": torch.ones(2), "meta": "a", "n": 3},
        Pair(torch.zeros(1), 5),
        [torch.ones(1), (torch.zeros(2), "s")],
        Sample(torch.ones(3), "name"),
        WithTo(torch.arange(3)),
    ]
    out = list(StreamPrefetcher(batches, device="cpu"))
    assert out[0]["meta"] == "a" and out[0]["n"] == 3 and torch.equal(out[0]["x"], torch.ones(2))
    assert isinstance(out[1], Pair) and out[1].y == 5
    assert out[2][1][1] == "s"
    assert isinstance(out[3], Sample) and out[3].name == "name"
    assert isinstance(out[4], WithTo) and torch.equal(out[4].t, torch.arange(3))


def test_loader_error_propagates_after_earlier_batches():
    class Boom(Exception):
        pass

    def gen():
        yield 1
        yield 2
        raise Boom("bad sample 3")

    got = []
    with pytest.raises(Boom, match="bad sample 3"):
        for b in StreamPrefetcher(gen(), device="cpu", depth=3):
            got.append(b)
    assert got == [1, 2]


def test_attributes_pass_through_both_ways():
    loader = DataLoader(IndexDataset(8), batch_size=2)
    wrapped = StreamPrefetcher(loader, device="cpu")
    assert wrapped.sampler is loader.sampler and wrapped.batch_sampler is loader.batch_sampler
    assert wrapped.dataset is loader.dataset

    def fn(worker_id):
        return None

    wrapped.worker_init_fn = fn
    assert loader.worker_init_fn is fn
    assert not hasattr(wrapped, "state_dict")  # a plain DataLoader is not stateful


def test_state_dict_is_from_before_the_lookahead():
    loader = StatefulLoader(IndexDataset(12), batch_size=2)
    wrapped = StreamPrefetcher(loader, device="cpu", depth=2)
    it = iter(wrapped)
    next(it)
    next(it)
    assert loader.state_dict() == {"consumed": 4}  # the look-ahead ran ahead...
    assert wrapped.state_dict() == {"consumed": 2}  # ...but the wrapper reports what it handed out
    resumed = StatefulLoader(IndexDataset(12), batch_size=2)
    wrapped2 = StreamPrefetcher(resumed, device="cpu")
    wrapped2.load_state_dict(wrapped.state_dict())
    assert [ids(b) for b in wrapped2] == [[4, 5], [6, 7], [8, 9], [10, 11]]


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"depth must be an int in \[1, 16\], got 0"):
        StreamPrefetcher([], device="cpu", depth=0)
    with pytest.raises(ValueError, match="normalize"):
        GPUNormalize((0.5,), (0.5, 0.5))
    with pytest.raises(ValueError, match="every std > 0"):
        GPUNormalize((0.5,), (0.0,))
    with pytest.raises(ValueError, match="dtype must be one of"):
        GPUNormalize(MEAN, STD, dtype="int8")
    with pytest.raises(ValueError, match="expects uint8 images"):
        GPUNormalize(MEAN, STD).tensor(torch.zeros(2, 3, 4, 4))


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 2e-2), ("float16", 3e-3)])
def test_normalize_matches_float64_reference_cpu(dtype, tol):
    x = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    out = GPUNormalize(MEAN, STD, dtype=dtype, channels_last=True)(x)
    assert out.dtype == getattr(torch, dtype)
    assert out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out.double(), _reference(x), atol=tol * 3, rtol=tol)


def test_normalize_selects_by_key_and_position():
    x = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    mask = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    out = GPUNormalize(MEAN, STD, key="image")({"image": x, "mask": mask})
    assert out["image"].dtype == torch.float32 and out["mask"].dtype == torch.uint8
    out = GPUNormalize(MEAN, STD, key=0)(Pair(x, mask))
    assert isinstance(out, Pair) and out.x.dtype == torch.float32 and out.y.dtype == torch.uint8
    out = GPUNormalize(MEAN, STD)((x, torch.arange(2)))  # key=None: every 4-D uint8 tensor
    assert out[0].dtype == torch.float32 and out[1].dtype == torch.int64
    with pytest.raises(KeyError, match="'img' is not in the batch"):
        GPUNormalize(MEAN, STD, key="img")({"image": x})


@pytest.mark.gpu
def test_gpu_batches_bit_identical_under_memory_churn():
    """A missing wait_stream/record_stream shows up as corrupted batches while other allocations churn memory."""
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.randn(64, 3, 64, 64, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(50)
    ]
    pinned = [(x.pin_memory(), y.pin_memory()) for x, y in data]
    expected = [_digest((x, y)) for x, y in data]
    for _ in range(6):  # 300 steps
        got = []
        for x, y in StreamPrefetcher(pinned, device="cuda", depth=2):
            junk = [torch.empty_like(x).fill_(float("nan")) for _ in range(3)]  # reuse freed blocks at once
            x = x * 1.0  # consume on the compute stream
            del junk
            got.append(_digest((x, y)))
        assert got == expected


@pytest.mark.gpu
def test_gpu_normalize_matches_float64_reference():
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    for dtype, tol in (("float32", 1e-5), ("bfloat16", 2e-2), ("float16", 3e-3)):
        (out,) = list(
            StreamPrefetcher([x.pin_memory()], device="cuda", normalize=GPUNormalize(MEAN, STD, dtype))
        )
        assert out.is_cuda and out.dtype == getattr(torch, dtype)
        torch.testing.assert_close(out.double().cpu(), _reference(x), atol=tol * 3, rtol=tol)


@pytest.mark.gpu
def test_gpu_reserved_memory_does_not_grow_across_epochs():
    data = [torch.randn(32, 3, 64, 64).pin_memory() for _ in range(20)]
    wrapped = StreamPrefetcher(data, device="cuda", depth=2)
    reserved = []
    for _ in range(8):
        for b in wrapped:
            b.mul_(2)
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
    assert reserved[-1] <= reserved[1], reserved


@pytest.mark.gpu
def test_gpu_unpinned_tensors_are_pinned_with_one_warning():
    import lightning_gpu_boost.core.prefetch as prefetch

    prefetch._warned_unpinned = False
    data = [torch.ones(4) * i for i in range(3)]
    with pytest.warns(UserWarning, match="pin_memory=True"):
        out = [b.cpu() for b in StreamPrefetcher(data, device="cuda")]
    assert [int(b[0]) for b in out] == [0, 1, 2]


def test_stateful_protocol_is_visible_statically():
    """Lightning saves loader state only for `isinstance(loader, _Stateful)`, checked statically on Python 3.12+."""
    from lightning.fabric.utilities.types import _Stateful

    assert isinstance(StreamPrefetcher(StatefulLoader(IndexDataset(4)), device="cpu"), _Stateful)
    assert not isinstance(StreamPrefetcher(DataLoader(IndexDataset(4)), device="cpu"), _Stateful)


def test_a_batch_transform_draws_the_same_numbers_whatever_the_depth_and_leaves_the_callers_rng_alone():
    """Per-sample randomness seeded per rank, epoch and batch: depth 1 and 3 give bit-identical batches, another
    epoch or rank other draws, and torch's global generator goes on as if nothing had drawn from it."""
    from lightning_gpu_boost.core.prefetch import batch_seed

    batches = [torch.zeros(4, 3) for _ in range(5)]

    def jitter(batch: torch.Tensor) -> torch.Tensor:  # one random value per sample, as a per-sample augmentation
        return batch + torch.rand(batch.shape[0], 1)

    def run(depth: int, epoch: int = 0, rank: int = 0) -> list[torch.Tensor]:
        p = StreamPrefetcher(batches, device="cpu", depth=depth, transform=jitter, seed=7, rank=rank)
        p.set_epoch(epoch)
        return list(p)

    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    one = run(1)
    assert torch.equal(torch.rand(3), expected_next), "the caller's random state moved"
    assert all(torch.equal(a, b) for a, b in zip(one, run(3), strict=True))
    assert not torch.equal(one[0], one[1]) and one[0][:, 0].unique().numel() == 4  # per batch, per sample
    assert not torch.equal(one[0], run(1, epoch=1)[0]) and not torch.equal(one[0], run(1, rank=1)[0])
    assert len({batch_seed(7, r, e, i) for r in range(4) for e in range(4) for i in range(64)}) == 4 * 4 * 64
    with pytest.raises(ValueError, match="transform must be a callable"):
        StreamPrefetcher(batches, device="cpu", transform="flip")


@pytest.mark.gpu
def test_the_gpu_transform_runs_on_the_side_stream_and_matches_the_same_transform_after_the_copy():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    batches = [torch.randint(0, 255, (16, 3, 64, 64), dtype=torch.uint8).pin_memory() for _ in range(6)]
    streams = []

    def augment(batch: torch.Tensor) -> torch.Tensor:
        streams.append(torch.cuda.current_stream())
        x = batch.float() / 255
        flip = torch.rand(x.shape[0], device=x.device) < 0.5  # per-sample flips
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        return x * torch.empty(x.shape[0], 1, 1, 1, device=x.device).uniform_(0.8, 1.2)

    deep = [b.clone() for b in StreamPrefetcher(batches, depth=3, transform=augment, seed=1)]
    assert all(s != torch.cuda.default_stream() for s in streams), "the transform ran on the compute stream"
    reference = []
    for i, b in enumerate(batches):  # the same draws, done by hand after a plain copy on the default stream
        with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
            torch.manual_seed(batch_seed_for(1, 0, 0, i))
            reference.append(augment(b.cuda()))
    assert all(torch.equal(a, b) for a, b in zip(deep, reference, strict=True))
