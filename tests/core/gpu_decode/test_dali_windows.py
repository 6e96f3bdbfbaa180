"""The GPU decode through DALI pipelines (``core/gpu_decode/dali_windows.py``), run with DALI's CPU decoder: the
same pipelines and hand-over as on a GPU, with its "mixed" decoder swapped for the CPU one."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import default_collate

from lightning_gpu_boost.core.gpu_decode import BatchDecoder, Record
from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliFailed, DaliWindows
from lightning_gpu_boost.core.gpu_decode.plan import geometry

pytest.importorskip("nvidia.dali", reason="DALI is not installed")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _jpeg(w: int, h: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _rows(jpegs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """JPEGs as DaliWindows takes them: a row each, padded to the longest, and their lengths."""
    rows = np.zeros((len(jpegs), max(map(len, jpegs))), np.uint8)
    for k, d in enumerate(jpegs):
        rows[k, : len(d)] = np.frombuffer(d, np.uint8)
    return rows, np.array([len(d) for d in jpegs])


def _record(seed: int, ops: list[tuple], w: int = 96, h: int = 80) -> Record:
    g = geometry(h, w, ops)
    return Record(jpeg=_jpeg(w, h, seed), ops=ops, geometry=(*g[0], *g[1], int(g[2])))


OPS = [[("crop", 3, 5, 60, 70), ("resize", 32, 32), ("flip",)], [("crop", 10, 20, 20, 24), ("resize", 32, 32)],
       [("resize", 40, 48), ("crop", 4, 8, 32, 32)], [("crop", 0, 0, 80, 96), ("resize", 32, 32)]]  # fmt: skip


def _geometry(ops: list[tuple], w: int = 96, h: int = 80) -> list[int]:
    g = geometry(h, w, ops)
    return [*g[0], *g[1], int(g[2])]


def _levels(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() - b.float()).abs()


@pytest.mark.parametrize("exec_dynamic", [True, False])
def test_images_are_the_windows_resized_and_flipped_as_pil_makes_them(monkeypatch, exec_dynamic):
    """Each sample's window decoded, the part the output covers resized (linear, antialiased) and flipped where
    drawn: PIL's crop, resize and flip of the same decoded image, within the stated tolerance; with DALI's dynamic
    executor and its older one (the benchmark's ``copy_3_legacy_exec`` variant)."""
    monkeypatch.setattr(DaliWindows, "_exec_dynamic", exec_dynamic)
    dali = DaliWindows("cpu", threads=1)
    data = [_jpeg(96, 80, s) for s in range(len(OPS))]
    ticket = dali.submit(*_rows(data), np.array([_geometry(ops) for ops in OPS]))
    got = dali.collect(ticket)
    assert got.shape == (4, 32, 32, 3) and got.dtype == torch.uint8
    for k, (d, ops) in enumerate(zip(data, OPS, strict=True)):
        image = Image.open(io.BytesIO(d)).convert("RGB")
        for op in ops:
            if op[0] == "crop":
                image = image.crop((op[2], op[1], op[2] + op[4], op[1] + op[3]))
            elif op[0] == "resize":
                image = image.resize((op[2], op[1]), Image.BILINEAR)
            else:
                image = image.transpose(Image.FLIP_LEFT_RIGHT)
        levels = _levels(got[k], torch.from_numpy(np.asarray(image).copy()))
        assert levels.mean() <= 1.5 and levels.max() <= 32, (k, float(levels.mean()), float(levels.max()))


@pytest.mark.parametrize("pipes", [1, 2, 3])
def test_batches_in_flight_beyond_the_pipelines_come_back_in_order(pipes):
    dali = DaliWindows("cpu", threads=1, pipes=pipes)
    tickets = []
    for s in range(5):  # more than the pipelines: the later ones wait for a free one
        ops = [("crop", 0, 0, 30, 40 + s), ("resize", 8 + s, 10)]
        tickets.append(dali.submit(*_rows([_jpeg(40 + s, 30, s)]), np.array([_geometry(ops, 40 + s, 30)]),
                                   capacity=4))  # fmt: skip
    assert [tuple(dali.collect(t).shape) for t in tickets] == [(1, 8 + s, 10, 3) for s in range(5)]
    assert dali.timings["batches"] == 5 and dali.timings["wait_s"] > 0
    one = _geometry([("resize", 8, 8)], 8, 8)
    with pytest.raises(DaliFailed, match="more than the 4"):
        dali.submit(*_rows([_jpeg(8, 8, 0)] * 5), np.array([one] * 5))
    with pytest.raises(ValueError, match="one row of bytes, one length and one geometry"):
        dali.submit(*_rows([_jpeg(8, 8, 0)] * 2), np.array([one]))


def test_a_first_batch_smaller_than_the_capacity_primes_the_pipeline_with_a_full_one(monkeypatch):
    """A new pipeline first runs once on the first batch's samples repeated to the capacity (nvImageCodec sizes the
    JPEG engines' share from the first batch it decodes); the batches handed over come back as they are."""
    fed: list[tuple[str, int]] = []
    build = DaliWindows._build

    def recorded(self, k):
        pipe = build(self, k)
        feed = pipe.feed_input
        pipe.feed_input = lambda name, value: (fed.append((name, len(value))), feed(name, value))[1]
        return pipe

    monkeypatch.setattr(DaliWindows, "_build", recorded)
    dali = DaliWindows("cpu", threads=1, pipes=1)
    data = [_jpeg(96, 80, s) for s in range(len(OPS))]
    first = dali.collect(dali.submit(*_rows(data[:1]), np.array([_geometry(OPS[0])]), capacity=4))
    full = dali.collect(dali.submit(*_rows(data), np.array([_geometry(ops) for ops in OPS])))
    names = len({name for name, _ in fed})
    assert [n for _, n in fed] == [4] * names + [1] * names + [4] * names  # primed, then the batches as they are
    assert first.shape == (1, 32, 32, 3) and torch.equal(first[0], full[0])
    assert dali.timings["batches"] == 2 and dali.timings["build_s"] > 0


def test_dali_windows_arguments_are_checked():
    with pytest.raises(ValueError, match="threads must be an int >= 1, got 0"):
        DaliWindows("cpu", threads=0)
    with pytest.raises(ValueError, match=r"hw_decoder_load must be a number in \[0, 1\], got 1.5"):
        DaliWindows("cpu", hw_decoder_load=1.5)
    with pytest.raises(ValueError, match="pipes must be an int >= 1, got 0"):
        DaliWindows("cpu", pipes=0)


def _within_tolerance(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The docs' stated tolerance between the GPU decode and the CPU transform, in 8-bit levels."""
    levels = ((a - b) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
    return bool(levels.mean() <= 1.5 and levels.max() <= 32.0)


def test_begin_and_end_give_the_values_of_the_synchronous_path():
    """The prefetcher hands a batch over at the fetch (begin) and takes it at the hand-out (end): the images are
    those the per-image path computes, within the stated tolerance (DALI resizes them), the workers' samples
    exactly; a batch of worker-decoded samples and JPEGs keeps its order."""
    pixels = torch.randint(0, 256, (3, 32, 32), dtype=torch.uint8)
    records = [_record(s, ops) for s, ops in enumerate(OPS)]
    records.insert(2, Record(pixels=pixels))
    batch = default_collate([(r, k) for k, r in enumerate(records)])
    assert batch[0].geometry.shape == (4, 11)
    sync = BatchDecoder(MEAN, STD, device="cpu", dali=False)
    expected = sync(batch)[0]
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    tokens = [decoder.begin(batch), decoder.begin(batch), decoder.begin(batch)]
    assert all(t[1] is not None for t in tokens) and decoder.asynchronous
    for token in tokens:
        images, labels = decoder.end(token)
        assert _within_tolerance(images, expected) and labels.tolist() == list(range(5))
        assert torch.equal(images[2], expected[2])  # the worker's pixels
    assert decoder.decoded_on_gpu == 12 and decoder.decoded_by_workers == 3 and decoder.last_share == 0.8
    decoder.close()


def test_a_changed_engine_load_takes_new_pipelines_and_the_batches_in_flight_finish_on_theirs():
    """DecoderChoice sets ``engine_load`` from the training thread while batches are in flight: the next batch
    handed over goes to new pipelines (DALI sets the engines' share at the build), the batches already handed over
    come back from theirs, whose pipelines are then closed; each batch says the load it was decoded with."""
    batch = default_collate([(_record(s, ops), s) for s, ops in enumerate(OPS)])
    expected = BatchDecoder(MEAN, STD, device="cpu", dali=False)(batch)[0]
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    assert decoder.engine_load is None
    tokens = [decoder.begin(batch), decoder.begin(batch)]
    first = decoder._dali
    assert first.hw_decoder_load == 1.0
    decoder.engine_load = 0.0
    tokens.append(decoder.begin(batch))
    assert decoder._dali is not first and decoder._dali.hw_decoder_load == 0.0 and decoder._retired == [first]
    loads = []
    for token in tokens:
        images, _ = decoder.end(token)
        loads.append(decoder.last_engine_load)
        assert _within_tolerance(images, expected)
    assert loads == [1.0, 1.0, 0.0]
    assert decoder._retired == [] and first._pipes == [None] * first.pipes  # closed once its batches came back
    assert decoder.end(decoder.begin(batch))[0].shape == expected.shape and decoder.last_engine_load == 0.0
    held = decoder.begin(batch)  # a loop stopped before handing it out, and the fit's end closed the pipelines
    decoder.engine_load = 1.0
    retired = decoder.begin(batch)
    decoder.close()
    assert decoder._dali is None and decoder._retired == []
    decoder.discard(held)
    decoder.discard(retired)  # nothing left to drop: no error


def test_a_batch_dali_fails_on_is_decoded_another_way(monkeypatch):
    batch = default_collate([(_record(s, ops), s) for s, ops in enumerate(OPS)])
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    expected = BatchDecoder(MEAN, STD, device="cpu", dali=False)(batch)[0]
    token = decoder.begin(batch)

    def refuse(ticket):
        raise DaliFailed("a JPEG DALI refuses")

    monkeypatch.setattr(decoder._dali, "collect", refuse)
    images, _ = decoder.end(token)
    assert torch.equal(images, expected) and decoder.dali_failures == 1


def test_without_dali_or_geometry_begin_defers_to_the_synchronous_path():
    plain = default_collate([(Record(jpeg=_jpeg(96, 80, 0), ops=OPS[0]), 0)])  # no geometry: an older worker
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    assert decoder.begin(plain)[1] is None
    off = BatchDecoder(MEAN, STD, device="cpu", dali=False)
    assert not off.asynchronous and off.begin(plain)[1] is None
    assert off.end(off.begin(plain))[0].shape == (1, 3, 32, 32)
    with pytest.raises(ValueError, match="dali must be True or False"):
        BatchDecoder(MEAN, STD, dali="yes")


def test_a_torchvision_image_folder_through_dali_matches_its_cpu_transform(tmp_path):
    """The user's shape: torchvision's ImageFolder with RandomResizedCrop and flip, taken over; its workers' records
    carry each sample's geometry; DALI's images are within the stated tolerance of the per-image path's and of the
    CPU transform with the same draws."""
    pytest.importorskip("torchvision")
    from torchvision import datasets
    from torchvision import transforms as T

    from lightning_gpu_boost.core.gpu_decode import Share, take_over
    from lightning_gpu_boost.core.images import make_jpeg_folder

    root = make_jpeg_folder(tmp_path / "tree", n=24, num_classes=2, progress=False)
    transform = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    plain, taken = datasets.ImageFolder(str(root), transform=transform), datasets.ImageFolder(str(root), transform=transform)
    take_over(taken, Share(1.0))
    torch.manual_seed(0)
    expected = torch.stack([plain[i][0] for i in range(len(plain))])
    torch.manual_seed(0)
    batch = default_collate([taken[i] for i in range(len(taken))])
    assert batch[0].geometry is not None and len(batch[0].jpeg_index) == len(taken)
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    images = decoder.end(decoder.begin(batch))[0]
    assert _within_tolerance(images, BatchDecoder(MEAN, STD, device="cpu", dali=False)(batch)[0])
    assert _within_tolerance(images, expected)


def test_the_fits_end_drops_dalis_pipelines():
    """The decode stage's detach (the fit's end, or a failed fit) closes its decoders: DALI's threads and memory go."""
    from torch.utils.data import DataLoader

    from lightning_gpu_boost.callbacks._gpu_decode import GPUDecodeStage

    stage = GPUDecodeStage("gpu")
    loader = DataLoader(list(range(4)), batch_size=2)
    decoder = BatchDecoder(MEAN, STD, device="cpu")
    batch = default_collate([(_record(0, OPS[0]), 0)])
    decoder.end(decoder.begin(batch))
    assert decoder._dali
    stage._decoders[loader] = decoder
    stage.detach()
    assert decoder._dali is None


def test_a_worker_forked_beside_unreachable_pipelines_does_not_hang():
    """A pipeline left to the garbage collector (unreachable in a cycle, the collector off until then) is taken in a
    DataLoader worker forked meanwhile, too: shutting it down there waited forever for DALI's threads, which fork
    does not copy, and the loader hung. The worker forgets the pipelines it copied; ``close`` shuts them down here."""
    from tests.helpers import batches_beside_garbage

    def used() -> DaliWindows:
        dali = DaliWindows("cpu", threads=1, pipes=1)
        dali.collect(dali.submit(*_rows([_jpeg(96, 80, 0)]), np.array([_geometry(OPS[0])]), capacity=1))
        return dali

    assert batches_beside_garbage(used) == [[0], [1]]
    closed = used()
    pipe = closed._pipes[0]
    closed.close()
    assert pipe._pipe is None  # its threads stopped now, not when the collector takes it
