"""Checked streams (``core/streaming/checked.py``): no flipped byte in a chunk trains a wrong sample, a damaged sample
is named by its object and place and raised or skipped, another schema is refused by the source check, and a store
that stops answering is reported within ``stall_s`` naming the object and the endpoint, then retried."""

from __future__ import annotations

import random
import shutil
import threading
import warnings
from pathlib import Path
from urllib.parse import urlparse

import pytest

pytest.importorskip("litdata")

import lightning.pytorch as pl
import torch

from lightning_gpu_boost.core.bad_samples import BadSample, BadSampleError
from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.core.streaming import (
    DecodeImage,
    StreamSourceError,
    check_stream_source,
    write_image_stream,
)
from lightning_gpu_boost.core.streaming.checked import CheckedStream
from lightning_gpu_boost.datamodules import StreamingDataModule
from tests.helpers import ImageIdModel
from tests.link_proxy import LinkProxy

N = 24


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """A local stream of 24 images, one class each, in 20 KB chunks; and its checked source."""
    root = tmp_path_factory.mktemp("checked")
    folder = make_jpeg_folder(root / "jpegs", n=N, num_classes=N, size_range=(64, 80, 48, 64), progress=False)
    write_image_stream(folder, str(root / "stream"), chunk_bytes="20KB", num_workers=1, start_method="fork")
    return str(root / "stream"), check_stream_source(str(root / "stream"))


def _read(url, source, bad_samples="skip"):
    """Every sample of the stream in its stored order: ``(center crop, label)`` or a ``BadSample``."""
    dataset = CheckedStream(url, chunks=source.chunks, chunk_samples=source.chunk_samples, bad_samples=bad_samples,
                            shuffle=False, transform=DecodeImage(32, train=False))  # fmt: skip
    return list(dataset)


def _flip(src, dst, source, rnd):
    shutil.copytree(src, dst)
    chunk = rnd.choice(source.chunks)
    data = bytearray((dst / chunk).read_bytes())
    data[rnd.randrange(len(data))] ^= 1 << rnd.randrange(8)
    (dst / chunk).write_bytes(bytes(data))
    return chunk


@pytest.mark.timeout(300)
def test_no_flipped_byte_in_500_trains_a_wrong_sample(stream, tmp_path):
    url, source = stream
    good = _read(url, source)
    assert not any(isinstance(s, BadSample) for s in good) and len(good) == N
    rnd, silent, found = random.Random(0), 0, 0
    for k in range(500):
        flipped = tmp_path / f"flip-{k}"
        _flip(Path(url), flipped, source, rnd)
        got = _read(str(flipped), source)
        assert len(got) == N  # the stream's length never changes: a damaged sample is a BadSample in its place
        for sample, want in zip(got, good, strict=True):
            if isinstance(sample, BadSample):
                found += 1
                assert sample.path.startswith(str(flipped)) and sample.path.endswith(".bin") and sample.reason
            elif sample[1] != want[1] or not torch.equal(sample[0], want[0]):
                silent += 1
        shutil.rmtree(flipped)
    assert silent == 0 and found >= 450, (silent, found)


def test_a_damaged_sample_is_raised_naming_its_object_and_place(stream, tmp_path):
    url, source = stream
    damaged = tmp_path / "damaged"
    shutil.copytree(url, damaged)
    chunk = damaged / source.chunks[1]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10  # inside an image's bytes
    chunk.write_bytes(bytes(data))
    with pytest.raises(BadSampleError, match=rf"Cannot use sample \d+ of {damaged}/{source.chunks[1]}: checksum "
                                             r"mismatch .*bad_samples='skip'"):  # fmt: skip
        _read(str(damaged), source, bad_samples="raise")


def test_another_schema_is_refused_by_the_source_check(tmp_path):
    import litdata

    litdata.optimize(fn=_not_an_image, inputs=list(range(8)), output_dir=str(tmp_path / "numbers"),
                     chunk_bytes="1KB", num_workers=1, mode="overwrite", verbose=False, start_method="fork")  # fmt: skip
    with pytest.raises(StreamSourceError, match=r"another schema \(x: int, y: str\).*'image'.*write_image_stream"):
        check_stream_source(str(tmp_path / "numbers"))


def _not_an_image(i):
    return {"x": i, "y": str(i)}


def test_a_damaged_sample_in_training_is_skipped_and_named_once(stream, tmp_path, trainer_kwargs):
    url, source = stream
    damaged = tmp_path / "damaged"
    shutil.copytree(url, damaged)
    chunk = damaged / source.chunks[0]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    model = ImageIdModel()
    dm = StreamingDataModule(str(damaged), image_size=32, batch_size=4, num_workers=2, bad_samples="skip",
                             cache_dir=str(tmp_path / "cache"))  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pl.Trainer(max_epochs=1, **trainer_kwargs).fit(model, datamodule=dm)
    seen = sum(model.seen["train"], [])
    assert len(seen) == N - 1 and len(set(seen)) == N - 1  # one sample dropped from its batch, no other lost
    skipped = [str(w.message) for w in caught if "bad train samples" in str(w.message)]
    assert len(skipped) == 1 and f"{damaged}/{source.chunks[0]}" in skipped[0], skipped


@pytest.mark.timeout(180)
def test_a_store_that_stops_answering_is_reported_within_stall_s_and_retried(s3, tmp_path, trainer_kwargs, capfd):
    folder = make_jpeg_folder(tmp_path / "jpegs", n=12, num_classes=12, size_range=(64, 80, 48, 64), progress=False)
    url = f"s3://{s3.bucket('stalls')}/stream"
    write_image_stream(folder, url, chunk_bytes="20KB", num_workers=1, storage_options=s3.storage_options,
                       start_method="fork")
    endpoint = urlparse(s3.endpoint)
    proxy = LinkProxy(endpoint.hostname, endpoint.port).start()
    try:
        dm = StreamingDataModule(url, image_size=32, batch_size=4, num_workers=1, cache_dir=str(tmp_path / "cache"),
                                 stall_s=2.0, storage_options={**s3.storage_options, "endpoint_url": proxy.url})  # fmt: skip
        proxy.stall = b".bin"  # the store stops answering for the chunks, for 7 s
        threading.Timer(7.0, lambda: setattr(proxy, "stall", None)).start()
        model = ImageIdModel()
        pl.Trainer(max_epochs=1, **trainer_kwargs).fit(model, datamodule=dm)
    finally:
        proxy.stop()
    assert sorted(sum(model.seen["train"], [])) == list(range(12))  # retried: every sample once
    err = capfd.readouterr().err
    assert "stream stalled" in err and f"{url}/chunk-" in err and proxy.url in err, err[-2000:]


def test_a_store_that_never_answers_ends_in_one_error_naming_the_object_and_endpoint(stream, monkeypatch):
    import litdata
    from litdata.exceptions import ChunkWaitTimeoutError

    from lightning_gpu_boost.core.streaming.checked import StreamReadError

    url, source = stream

    def never(self, index):  # what litdata raises when a chunk's download never completes (after MAX_WAIT_TIME)
        raise ChunkWaitTimeoutError(f"/cache/abc123/{source.chunks[index.chunk_index]}", 120.0)

    monkeypatch.setattr(litdata.StreamingDataset, "__getitem__", never)
    with pytest.raises(StreamReadError, match=rf"Cannot read {url}/chunk-\d+-\d+\.bin from the local disk: no complete "
                                              r"copy after \d+ s of waiting"):  # fmt: skip
        _read(url, source)
