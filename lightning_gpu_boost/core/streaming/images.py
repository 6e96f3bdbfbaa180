"""An image folder as a litdata stream, and its samples decoded in the loader's workers.

:func:`write_image_stream` scans ``<src>/<class>/<image>`` as ``pack`` does, checks every file with ``pack``'s
structure check (broken files are left out and listed, never streamed), and writes the good ones with litdata's
``optimize`` as samples ``{"image": <the file's bytes>, "label": int, "index": int, "crc": int}``; ``index`` is the sample's
place in the folder's sorted order, so a run can be checked for every sample exactly once, and ``crc`` is
:func:`sample_crc` of the other three, compared where the sample is read (:func:`checked_sample`). A remote destination
(``s3://bucket/prefix``) is written locally first and uploaded with boto3, chunks first and ``index.json`` last: an
upload that stops halfway leaves no index, which :func:`~lightning_gpu_boost.core.streaming.source.check_stream_source`
reports as an interrupted upload instead of a stream with holes.

:class:`DecodeImage` is litdata's per-sample ``transform``: the bytes decoded into a uint8 CHW crop with the same
reduced-size JPEG decode as ``ImageFolderDataModule`` (random-resized crop and flip for training, resize and center
crop for validation), so the batches are uint8 and normalized on the GPU by ``StreamPrefetch`` / ``GPUBoost()``.
A sample whose fields are missing, whose checksum does not match or whose image does not decode raises
:class:`StreamSampleError` with the cause; :class:`~lightning_gpu_boost.core.streaming.checked.CheckedStream` names the
object and the sample and applies the ``bad_samples`` policy.
"""

from __future__ import annotations

import io
import json
import os
import random
import struct
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

__all__ = ["DecodeImage", "SAMPLE_FIELDS", "StreamSampleError", "checked_sample", "sample_crc", "write_image_stream",
           "written_samples"]

#: the fields of a sample written by :func:`write_image_stream`, in litdata's order (``crc`` last)
SAMPLE_FIELDS = ("image", "label", "index", "crc")


class StreamSampleError(ValueError):
    """A stream sample that cannot be used: its fields, its checksum or its image; the message is the cause."""


def sample_crc(image: bytes | bytearray | memoryview, label: int, index: int) -> int:
    """CRC-32 of a sample's label, index and image bytes (what :func:`write_image_stream` stores as ``crc``)."""
    return zlib.crc32(image, zlib.crc32(struct.pack("<qq", int(label), int(index))))


def checked_sample(sample: Any) -> tuple[bytes, int]:
    """``(image bytes, label)`` of a stream sample, its checksum compared where it has one. Raises
    :class:`StreamSampleError` naming the cause: fields missing or of another type, or a checksum that does not
    match (the bytes, the label or the index changed after writing)."""
    if not isinstance(sample, dict) or "image" not in sample or "label" not in sample:
        fields = sorted(sample) if isinstance(sample, dict) else type(sample).__name__
        raise StreamSampleError(f"not an image sample: fields {fields}, where 'image' and 'label' are needed")
    image, label = sample["image"], sample["label"]
    if not isinstance(image, (bytes, bytearray, memoryview)):
        raise StreamSampleError(f"its 'image' is {type(image).__name__}, not the image file's bytes")
    try:
        label = int(label)
    except (TypeError, ValueError):
        raise StreamSampleError(f"its 'label' is {label!r}, not an int") from None
    if "crc" in sample:
        read = sample_crc(image, label, sample.get("index", 0))
        if read != int(sample["crc"]):
            raise StreamSampleError(
                f"checksum mismatch (stored {int(sample['crc']):#010x}, read {read:#010x}): its bytes, label or index "
                "changed after writing (damage on disk or in transfer)"
            )
    return bytes(image), label


class DecodeImage:
    """litdata ``transform``: a sample ``{"image": bytes, "label": int, ...}`` -> ``(uint8 CHW tensor, label)``."""

    def __init__(self, image_size: int = 224, train: bool = True, val_resize: int | None = None,
                 scale: tuple[float, float] = (0.08, 1.0)) -> None:  # fmt: skip
        self.image_size, self.train, self.val_resize, self.scale = image_size, train, val_resize, tuple(scale)

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int]:
        from lightning_gpu_boost.core.images import decode_center_crop, decode_random_resized_crop

        raw, label = checked_sample(sample)
        data = io.BytesIO(raw)
        try:
            if self.train:
                image = decode_random_resized_crop(data, self.image_size, scale=self.scale, rng=random)
            else:
                image = decode_center_crop(data, self.image_size, self.val_resize)
        except Exception as err:  # Pillow raises OSError, ValueError, SyntaxError, EOFError...
            text = str(err).split(" <_io.BytesIO")[0]
            raise StreamSampleError(f"cannot decode its image: {text or type(err).__name__}") from None
        return image, label


class _ReadSample:
    """litdata ``optimize``'s ``fn``: ``(path, label, index)`` -> the stored sample."""

    def __call__(self, item: tuple[str, int, int]) -> dict[str, Any]:
        path, label, index = item
        with open(path, "rb") as f:
            image = f.read()
        return {"image": image, "label": int(label), "index": int(index), "crc": sample_crc(image, label, index)}


def _upload(local: str, url: str, storage_options: dict[str, Any] | None) -> None:
    """Upload the stream in ``local`` to ``url``: chunks first, ``index.json`` last."""
    from lightning_gpu_boost.core.streaming.source import _s3_client

    parsed = urlparse(url)
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    client = _s3_client(storage_options)
    names = sorted(n for n in os.listdir(local) if n != "index.json")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: client.upload_file(os.path.join(local, n), bucket, f"{prefix}/{n}".lstrip("/")), names))
    client.upload_file(os.path.join(local, "index.json"), bucket, f"{prefix}/index.json".lstrip("/"))


def written_samples(folder: str | os.PathLike) -> int:
    """The samples a litdata stream's ``index.json`` in ``folder`` lists (0 where it lists no chunk)."""
    index = json.loads(Path(folder, "index.json").read_text())
    return sum(int(chunk.get("chunk_size", 0)) for chunk in index.get("chunks") or [])


def write_image_stream(
    src: str | os.PathLike,
    dst: str,
    chunk_bytes: str | int = "64MB",
    num_workers: int | None = None,
    check: str = "structure",
    storage_options: dict[str, Any] | None = None,
    start_method: Literal["spawn", "fork", "forkserver"] | None = None,
) -> dict[str, Any]:
    """Write the image folder ``src`` as a litdata stream at ``dst`` (a local folder or ``s3://bucket/prefix``).

    Returns ``{"samples", "classes", "bad_samples", "url"}``; ``classes`` is also written beside the index as
    ``classes.json``. ``check``: ``"structure"`` (default) or ``"decode"``, as ``pack --check``, or ``"none"``.
    ``start_method``: how litdata starts its writer processes. ``None`` keeps litdata's default, spawn outside a
    notebook: each process imports the calling script again, so call this under ``if __name__ == "__main__":``.
    ``"fork"`` (Linux) starts them from this process as it is: no import again, no such guard needed.

    Raises:
        ValueError: ``check`` or ``start_method`` is not one of its values, or every file is broken (nothing to
            stream).
        RuntimeError: litdata wrote fewer samples than the folder's good files (nothing is uploaded then).
        ImportError: litdata (the ``stream`` extra) is missing.
    """
    from lightning_gpu_boost import _checks as checks
    from lightning_gpu_boost._imports import require
    from lightning_gpu_boost.core.bad_samples import check_file
    from lightning_gpu_boost.core.images import scan_image_folder

    checks.check_choice("check", check, ("structure", "decode", "none"))
    if start_method is not None:
        checks.check_choice("start_method", start_method, ("spawn", "fork", "forkserver"))
    litdata = require("litdata")
    samples, classes, _ = scan_image_folder(src)
    items = [(path, label, i) for i, (path, label) in enumerate(samples)]
    bad: list[dict[str, str]] = []
    if check != "none":
        with ThreadPoolExecutor(min(32, (os.cpu_count() or 1) * 2)) as pool:
            problems = list(pool.map(lambda item: check_file(item[0], check), items))  # type: ignore[arg-type]
        bad = [{"path": os.path.relpath(item[0], src), "reason": p} for item, p in zip(items, problems, strict=True) if p]
        items = [item for item, p in zip(items, problems, strict=True) if p is None]
    if not items:
        raise ValueError(f"Every image in {str(src)!r} is broken ({len(bad)} files): nothing to stream.")
    remote = urlparse(dst).scheme == "s3"
    with tempfile.TemporaryDirectory(prefix="lgb-stream-") as staging:
        out = os.path.join(staging, "stream") if remote else str(dst)
        workers = num_workers if num_workers is not None else max(1, min(len(items) // 64, os.cpu_count() or 1))
        import multiprocessing

        callers = multiprocessing.get_start_method(allow_none=True)
        try:
            litdata.optimize(fn=_ReadSample(), inputs=items, output_dir=out, chunk_bytes=chunk_bytes,
                             num_workers=workers, mode="overwrite", verbose=False,
                             start_method=start_method)  # fmt: skip
        finally:  # optimize sets the process's start method to spawn for good: the caller's DataLoaders keep theirs
            multiprocessing.set_start_method(callers, force=True)
        written = written_samples(out)
        if written != len(items):
            raise RuntimeError(
                f"Writing {str(dst)!r}: litdata's optimize wrote {written} of {len(items)} samples. Its workers are "
                "spawned and import the calling script again: call write_image_stream under "
                "`if __name__ == \"__main__\":` in a script, or pass start_method=\"fork\" (Linux)."
            )
        Path(out, "classes.json").write_text(json.dumps({"classes": classes, "bad_samples": bad}))
        if remote:
            _upload(out, dst, storage_options)
    return {"samples": len(items), "classes": classes, "bad_samples": bad, "url": str(dst)}
