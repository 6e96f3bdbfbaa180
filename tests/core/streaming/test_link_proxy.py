"""The link proxy (``tests/link_proxy.py``) in front of moto's S3 server: its latency and bandwidth cap hold, and a
stream is read through it."""

from __future__ import annotations

import time
from urllib.parse import urlparse

import pytest

from tests.link_proxy import LinkProxy


def test_latency_and_bandwidth_cap_hold_for_a_real_s3_get(s3):
    client = s3.client()
    client.put_object(Bucket=s3.bucket("link"), Key="blob", Body=b"x" * (2 << 20))
    endpoint = urlparse(s3.endpoint)
    proxy = LinkProxy(endpoint.hostname, endpoint.port, latency_s=0.05, bandwidth=8 << 20).start()
    try:
        import boto3

        slow = boto3.client("s3", endpoint_url=proxy.url, region_name="us-east-1", aws_access_key_id="testing",
                            aws_secret_access_key="testing")  # fmt: skip
        start = time.perf_counter()
        body = slow.get_object(Bucket="link", Key="blob")["Body"].read()
        took = time.perf_counter() - start
    finally:
        proxy.stop()
    assert len(body) == 2 << 20 and proxy.bytes_down >= 2 << 20
    assert 0.05 + 0.25 <= took < 2.0, took  # 2 MiB at 8 MiB/s, after the first byte's 50 ms


def test_a_stream_trains_through_the_link(s3, tmp_path, trainer_kwargs):
    pytest.importorskip("litdata")
    import lightning.pytorch as pl

    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.streaming import write_image_stream
    from lightning_gpu_boost.datamodules import StreamingDataModule
    from tests.helpers import ImageIdModel

    folder = make_jpeg_folder(tmp_path / "jpegs", n=12, num_classes=12, size_range=(64, 80, 48, 64), progress=False)
    url = f"s3://{s3.bucket('link')}/stream"
    write_image_stream(folder, url, chunk_bytes="20KB", num_workers=1, storage_options=s3.storage_options,
                       start_method="fork")
    endpoint = urlparse(s3.endpoint)
    proxy = LinkProxy(endpoint.hostname, endpoint.port, latency_s=0.02, bandwidth=4 << 20).start()
    try:
        model = ImageIdModel()
        dm = StreamingDataModule(url, image_size=32, batch_size=4, num_workers=1, cache_dir=str(tmp_path / "cache"),
                                 storage_options={**s3.storage_options, "endpoint_url": proxy.url})  # fmt: skip
        pl.Trainer(max_epochs=1, **trainer_kwargs).fit(model, datamodule=dm)
    finally:
        proxy.stop()
    assert sorted(sum(model.seen["train"], [])) == list(range(12)) and proxy.bytes_down > 0
