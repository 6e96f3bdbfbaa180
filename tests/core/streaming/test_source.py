"""Checking a stream before training (``core/streaming/source.py``) against a real S3 endpoint (moto's server on
127.0.0.1): each bad input is one error naming the URL, before any loader starts."""

from __future__ import annotations

import pytest

pytest.importorskip("litdata")

from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.core.streaming import StreamSourceError, check_stream_source, write_image_stream
from tests.s3_server import free_port


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_jpeg_folder(tmp_path_factory.mktemp("jpegs"), n=24, num_classes=3, size_range=(64, 80, 48, 64),
                            progress=False)  # fmt: skip


def test_a_written_stream_passes_locally_and_on_s3(folder, tmp_path, s3):
    local = write_image_stream(folder, str(tmp_path / "stream"), chunk_bytes="20KB", num_workers=1, start_method="fork")
    assert local["samples"] == 24 and local["classes"] == ["class_000", "class_001", "class_002"]
    source = check_stream_source(str(tmp_path / "stream"))
    assert source.samples == 24 and len(source.chunks) > 1 and not source.remote
    url = f"s3://{s3.bucket('streams')}/written"
    write_image_stream(folder, url, chunk_bytes="20KB", num_workers=1, storage_options=s3.storage_options,
                       start_method="fork")
    source = check_stream_source(url, s3.storage_options)
    assert source.samples == 24 and source.remote


def test_each_bad_input_is_one_error_naming_the_url(folder, tmp_path, s3, monkeypatch):
    url = f"s3://{s3.bucket('streams')}/bad-inputs"
    write_image_stream(folder, url, chunk_bytes="20KB", num_workers=1, storage_options=s3.storage_options,
                       start_method="fork")
    closed = {**s3.storage_options, "endpoint_url": f"http://127.0.0.1:{free_port()}"}
    with pytest.raises(StreamSourceError, match=r"Cannot reach http://127\.0\.0\.1:\d+ to read 's3://streams/bad-inputs'"):
        check_stream_source(url, closed)
    with pytest.raises(StreamSourceError, match=r"Bucket 'nope' does not exist"):
        check_stream_source("s3://nope/x", s3.storage_options)
    with pytest.raises(StreamSourceError, match=r"Nothing at 's3://streams/missing'"):
        check_stream_source("s3://streams/missing", s3.storage_options)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(StreamSourceError, match=r"No credentials to read 's3://streams/bad-inputs'"):
        check_stream_source(url, {"endpoint_url": s3.endpoint})
    client, objects = s3.client(), None
    objects = [o["Key"] for o in client.list_objects_v2(Bucket="streams", Prefix="bad-inputs/")["Contents"]]
    chunk = next(k for k in objects if k.endswith(".bin"))
    client.delete_object(Bucket="streams", Key=chunk)  # an upload that stopped before this chunk
    with pytest.raises(StreamSourceError, match=r"is incomplete: 1 chunk\(s\) its index lists are missing"):
        check_stream_source(url, s3.storage_options)
    client.delete_object(Bucket="streams", Key="bad-inputs/index.json")  # ... or before its index
    with pytest.raises(StreamSourceError, match=r"no index\.json: an upload that stopped"):
        check_stream_source(url, s3.storage_options)
    with pytest.raises(StreamSourceError, match=r"No folder at"):
        check_stream_source(str(tmp_path / "absent"))
    with pytest.raises(StreamSourceError, match=r"only s3:// URLs and local folders"):
        check_stream_source("gs://bucket/x")


def test_a_folder_of_broken_files_is_refused_and_broken_files_are_listed(tmp_path, broken_tree):
    root, broken = broken_tree
    out = write_image_stream(root, str(tmp_path / "stream"), num_workers=1, start_method="fork")
    listed = {entry["path"] for entry in out["bad_samples"]}
    assert listed and listed <= set(broken)
    with pytest.raises(ValueError, match=r"check must be one of"):
        write_image_stream(root, str(tmp_path / "s2"), check="fast")


def test_a_stream_written_short_is_refused_not_returned(folder, tmp_path):
    """litdata's optimize spawns its workers, which import the calling script again: a script without a main guard
    got back an index of no chunks and went on to train on nothing. Now the write fails, naming the fix."""
    import subprocess
    import sys
    import textwrap

    from lightning_gpu_boost.core.streaming.images import written_samples
    from tests.fresh_python import run_fresh

    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        from lightning_gpu_boost.core.streaming import write_image_stream
        write_image_stream({str(folder)!r}, {str(tmp_path / "out")!r}, chunk_bytes="20KB", num_workers=1)
        print("returned")
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "returned" not in run.stdout
    assert "wrote 0 of 24 samples" in run.stderr and '__name__ == "__main__"' in run.stderr
    assert 'start_method="fork"' in run.stderr
    assert written_samples(tmp_path / "out") == 0
    # the other way out: writer processes forked from the script as it is, which import nothing again
    status, output = run_fresh(script.read_text().replace("num_workers=1", 'num_workers=1, start_method="fork"'),
                               cwd=tmp_path)  # fmt: skip
    assert status == 0 and "returned" in output and written_samples(tmp_path / "out") == 24, output[-2000:]
    with pytest.raises(ValueError, match=r"start_method must be one of 'spawn', 'fork', 'forkserver'"):
        write_image_stream(folder, str(tmp_path / "s3"), start_method="thread")
