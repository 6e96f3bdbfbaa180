"""Bad samples: found cheaply where bytes are read, named by their original path, skipped or raised by policy.

Framework-free: :func:`check_image` (used by ``pack`` as it stores what its threads read, and by the DALI feeder),
:class:`BadSample` (what a dataset returns in place of a sample it cannot decode under ``bad_samples="skip"``),
:class:`SkipBadCollate` (drops them from the batch; :mod:`~lightning_gpu_boost.core.refill` re-forms full batches) and :class:`BadSampleTracker` (counts them across DataLoader
worker processes through shared memory, so the training process can report them per epoch).

Two check levels:

- ``"structure"`` (``pack``'s default): the bytes are a known image format and end where the format says (JPEG:
  markers walked to the scan, then an end-of-image marker after it; PNG: the chunk chain read to ``IEND``); other
  formats are opened and decoded by Pillow. Catches empty files, HTML or text saved under an image name, random
  bytes, truncated downloads, and unreadable or dangling files, at a few microseconds per file.
- ``"decode"``: Pillow opens the image and decodes it at the smallest JPEG draft scale (1/8), which also catches
  damage inside the compressed data; it costs about as much as a reduced decode (see ``docs/bad_samples.md``).
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lightning_gpu_boost.core.refill import Counted, batch_layout

__all__ = ['BROKEN_KINDS', 'BadSample', 'BadSampleError', 'BadSampleLog', 'BadSampleTracker', 'CHECK_LEVELS', 'CheckLevel', 'POLICIES', 'SkipBadCollate', 'UNUSUAL_KINDS', 'add_broken_files', 'add_unusual_images', 'bad_sample_error', 'check_file', 'check_image', 'decode_problem', 'describe']

CheckLevel = Literal["structure", "decode"]
CHECK_LEVELS = ("structure", "decode")
POLICIES = ("raise", "skip")

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


class BadSampleError(RuntimeError):
    """A sample that cannot be read or decoded; the message names its original path and the fix."""


_SEGMENT = struct.Struct(">BBH").unpack_from  # 0xFF, the marker, the segment's length


#: markers where a segment is expected that the careful walk handles: fill bytes, markers without a segment
_NOT_A_SEGMENT = frozenset({0xFF, 0x01, *range(0xD0, 0xDA)})


def _jpeg_problem(data: bytes | memoryview) -> str | None:
    n, i, frame, segment = len(data), 2, False, _SEGMENT
    # the usual file, segment after segment, in as few steps as Python allows (this runs on the pack's critical path
    # for every file); anything else (fill bytes, markers without a segment, damage) goes on in the careful walk
    while i + 4 <= n:
        ff, marker, length = segment(data, i)
        if ff != 0xFF or length < 2 or marker in _NOT_A_SEGMENT:
            break
        if marker == 0xDA:  # start of scan: the compressed data follows, then (eventually) the end marker
            if not frame:
                return "damaged JPEG: image data without a frame header"
            return _jpeg_scan_end(data, i + 2 + length)
        if marker in _JPEG_SOF:
            frame = True
        i += 2 + length
    return _jpeg_walk(data, i, frame)


def _jpeg_walk(data: bytes | memoryview, i: int, frame: bool) -> str | None:
    """The JPEG's segments from byte ``i`` on, fill bytes and markers without a segment included (``frame``: a
    frame header was seen before ``i``)."""
    n = len(data)
    while i < n:
        if i + 4 <= n:  # the usual case in one call: a marker with a segment, no fill bytes
            ff, marker, length = _SEGMENT(data, i)
            if ff == 0xFF and marker != 0xFF and marker != 0x01 and not 0xD0 <= marker <= 0xD9 and length >= 2:
                if marker == 0xDA:  # start of scan: the compressed data follows, then (eventually) the end marker
                    if not (frame or marker in _JPEG_SOF):
                        return "damaged JPEG: image data without a frame header"
                    return _jpeg_scan_end(data, i + 2 + length)
                frame = frame or marker in _JPEG_SOF
                i += 2 + length
                continue
        if data[i] != 0xFF:
            return f"damaged JPEG: no marker at byte {i}"
        while i < n and data[i] == 0xFF:  # fill bytes
            i += 1
        if i >= n:
            break
        marker = data[i]
        i += 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a segment
            continue
        if marker == 0xD9:
            return "damaged JPEG: ends before its image data"
        if i + 2 > n:
            break
        length = (data[i] << 8) | data[i + 1]
        if length < 2:
            return f"damaged JPEG: segment of length {length} at byte {i}"
        frame = frame or marker in _JPEG_SOF
        if marker == 0xDA:
            if not frame:
                return "damaged JPEG: image data without a frame header"
            return _jpeg_scan_end(data, i + length)
        i += length
    return f"truncated JPEG: the file ends inside its headers ({n} bytes)"


def _jpeg_scan_end(data: bytes | memoryview, start: int) -> str | None:
    """The image data from ``start`` is followed by an end-of-image marker (usually the file's last two bytes)."""
    n = len(data)
    if n >= 2 and data[n - 2] == 0xFF and data[n - 1] == 0xD9:
        return None
    if bytes(data).find(b"\xff\xd9", start) >= 0:
        return None
    return "truncated JPEG: no end-of-image marker after the image data"


def _png_problem(data: bytes | memoryview) -> str | None:
    n, i, first = len(data), 8, True
    while i + 8 <= n:
        length, kind = struct.unpack_from(">I4s", data, i)
        if first and kind != b"IHDR":
            return "damaged PNG: the first chunk is not IHDR"
        first = False
        end = i + 12 + length
        if end > n:
            return f"truncated PNG: chunk {kind!r} runs past the end of the file ({n} bytes)"
        if kind == b"IEND":
            return None
        i = end
    return f"truncated PNG: no IEND chunk ({n} bytes)"


def _pillow_problem(data: bytes | memoryview, draft: bool) -> str | None:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            if draft and img.format == "JPEG":
                img.draft("RGB", (max(1, img.size[0] // 8), max(1, img.size[1] // 8)))
            img.load()
    except Exception as err:  # Pillow raises OSError, ValueError, SyntaxError, EOFError, DecompressionBombError...
        text = str(err).split(" <_io.BytesIO")[0]
        return f"cannot decode: {text or type(err).__name__}"
    return None


def check_image(data: bytes | bytearray | memoryview, level: CheckLevel = "structure") -> str | None:
    """Why ``data`` (an encoded image file's bytes) is not a usable image, or ``None`` if it passes ``level``."""
    if len(data) == 0:
        return "empty file (0 bytes)"
    head = bytes(data[:16])
    if head.startswith(b"\xff\xd8\xff"):
        problem = _jpeg_problem(data)
    elif head[:8] == _PNG_SIGNATURE:
        problem = _png_problem(data)
    elif head.lstrip()[:1] == b"<":
        return "not an image: the file is HTML or XML text"
    else:
        return _pillow_problem(data, draft=False)  # other formats: Pillow decodes them
    if problem is None and level == "decode":
        return _pillow_problem(data, draft=True)
    return problem


def decode_problem(data: bytes | bytearray | memoryview) -> str | None:
    """Why ``data`` does not decode in full with Pillow (``verify --decode``), or ``None``."""
    return _pillow_problem(data, draft=False)


def check_file(path: str | os.PathLike, level: CheckLevel = "structure") -> str | None:
    """:func:`check_image` of a file, with unreadable files (dangling links, no permission) reported the same way."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        return f"cannot read: {err.strerror or err}"
    return check_image(data, level)


# ------------------------------------------------------------------------------------------ reading time


@dataclass(frozen=True)
class BadSample:
    """Returned by a dataset in place of a sample it cannot use under ``bad_samples="skip"``; dropped from its
    batch by :class:`SkipBadCollate`."""

    index: int
    path: str
    reason: str


class BadSampleTracker:
    """Counts bad samples per index in shared memory: written by DataLoader workers (each index is loaded by one
    worker at a time, so no count is lost), read by the training process (:meth:`total`, :meth:`since`)."""

    def __init__(self, n: int) -> None:
        import torch

        self.counts = torch.zeros(n, dtype=torch.int32).share_memory_()

    def mark(self, index: int) -> None:
        self.counts[index] += 1

    def total(self) -> int:
        return int(self.counts.sum())

    def snapshot(self) -> Any:
        return self.counts.clone()

    def since(self, snapshot: Any) -> tuple[int, list[int]]:
        """Bad samples met since ``snapshot`` (:meth:`snapshot`): their count and their indices."""
        diff = self.counts - snapshot
        return int(diff.sum()), diff.nonzero().flatten().tolist()


class BadSampleLog:
    """What one loader's passes over its data skipped (``bad_samples="skip"``): the loader calls :meth:`watch`
    around each pass; at the pass's end, one warning naming the first paths where samples were skipped, and an entry
    in :attr:`history`. A metrics callback reads :meth:`current` (the count of the pass under way or just ended).

    Args:
        owner: has ``bad_sample_tracker`` (:class:`BadSampleTracker`, or any object with ``snapshot()`` and
            ``since(snapshot)``) and ``sample_path(index)``.
        stage: named in the warning (``"train"``, ``"val"``...).
        warn: called with the warning's text (``warnings.warn`` by default; Lightning's ``rank_zero_warn`` from
            the DataModules).
    """

    def __init__(self, owner: Any, stage: str = "train", warn: Callable[[str], Any] | None = None) -> None:
        import warnings

        self.owner, self.stage = owner, stage
        self.warn = warn if warn is not None else warnings.warn
        self._snapshot: Any = None
        #: one entry per pass that ended: ``{"stage", "epoch", "skipped", "paths"}``
        self.history: list[dict[str, Any]] = []

    def start(self) -> None:
        self._snapshot = self.owner.bad_sample_tracker.snapshot()

    def current(self) -> tuple[int, list[int]]:
        """Samples skipped since the latest pass started: their count and indices."""
        if self._snapshot is None:
            return 0, []
        return self.owner.bad_sample_tracker.since(self._snapshot)

    def end(self, epoch: int | None = None) -> dict[str, Any]:
        count, indices = self.current()
        paths = [self.owner.sample_path(i) for i in indices[:5]]
        entry = {"stage": self.stage, "epoch": epoch, "skipped": count, "paths": paths}
        self.history.append(entry)
        if count:
            where = f"Epoch {epoch}: s" if epoch is not None else "S"
            self.warn(f"{where}kipped {count} bad {self.stage} samples (bad_samples='skip'): "
                      f"{describe(paths, len(indices))}. The next samples took their places; "
                      "`lightning-gpu-boost pack` leaves such files out and lists them.")  # fmt: skip
        return entry

    def watch(self, batches: Any, epoch: int | None = None) -> Any:
        """Yield ``batches``, one pass: started now, ended where the pass ends (also when the loop stops early
        and drops the iterator)."""
        self.start()
        try:
            yield from batches
        finally:
            self.end(epoch)


def bad_sample_error(index: int, path: str, root: str, reason: str) -> BadSampleError:
    """The error a reader raises under ``bad_samples="raise"``: the sample, its original file, the fix."""
    return BadSampleError(
        f"Cannot use sample {index} ({path!r}) of {root!r}: {reason}. Fix or remove the file (`lightning-gpu-boost "
        "pack` leaves such files out and lists them), or pass bad_samples='skip' to drop bad samples from their "
        "batches."
    )


def describe(paths: Sequence[str], total: int) -> str:
    shown = ", ".join(repr(p) for p in paths)
    return shown + (f" and {total - len(paths)} more" if total > len(paths) else "")


class SkipBadCollate:
    """Wraps a collate function: :class:`BadSample` entries are dropped, so the batch holds the good samples (a
    batch that held ``k`` bad samples is ``k`` short; no good sample is repeated or lost).

    With ``refill=True`` (what :class:`RefillDataLoader` sets) each batch travels as a :class:`Counted` that says how
    many samples it holds and which of its parts carry the batch dimension, so that :class:`Refill` can re-form
    full batches in the main process; a batch whose samples are all bad then travels empty instead of raising."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any] | None = None, refill: bool = False) -> None:
        self.collate_fn = collate_fn
        self.refill = refill

    def _collate(self, samples: list[Any]) -> Any:
        if self.collate_fn is None:
            from torch.utils.data import default_collate

            return default_collate(samples)
        return self.collate_fn(samples)

    def __call__(self, samples: list[Any]) -> Any:
        good = [s for s in samples if not isinstance(s, BadSample)]
        if not good:
            if self.refill:
                return Counted(None, 0, None)
            bad = [s for s in samples if isinstance(s, BadSample)]
            raise BadSampleError(
                f"Every sample of a batch is bad ({describe([s.path for s in bad[:5]], len(bad))}: {bad[0].reason}); "
                "remove or repack the broken files (`lightning-gpu-boost pack` skips and lists them)."
            )
        batch = self._collate(good)
        if not self.refill:
            return batch
        layout = batch_layout(self._collate(good[:1]), batch, len(good)) if len(good) > 1 else None
        return Counted(batch, len(good), layout)


BROKEN_KINDS = ("empty", "html", "random_bytes", "truncated_jpeg", "truncated_png", "dangling_link")


def _encoded(mode: str, fmt: str, size: tuple[int, int] = (64, 48), **save: Any) -> bytes:
    import numpy as np
    from PIL import Image

    # smooth ramps (red left to right, green top to bottom): a turned or mirrored decode shows
    x = np.linspace(0, 1, size[0])[None, :].repeat(size[1], 0)
    y = np.linspace(0, 1, size[1])[:, None].repeat(size[0], 1)
    rgb = Image.fromarray((np.stack([x, y, 0.5 + 0 * x], -1) * 255).astype(np.uint8), "RGB")
    if mode == "I;16":
        img = Image.fromarray((x * 65535).astype(np.uint16))
    else:
        img = rgb.convert(mode)
    out = io.BytesIO()
    img.save(out, fmt, **save)
    return out.getvalue()


def add_broken_files(root: str | os.PathLike, per_kind: int = 1, seed: int = 0) -> list[str]:
    """Write ``per_kind`` broken files of each of :data:`BROKEN_KINDS` into the class folders of ``root`` (round
    robin), named ``broken-<kind>-<i>.jpg``/``.png``; returns their paths relative to ``root``, sorted."""
    import random

    rnd = random.Random(seed)
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    jpeg, png = _encoded("RGB", "JPEG", (96, 64)), _encoded("RGB", "PNG", (96, 64))
    written = []
    for i in range(per_kind):
        for k, kind in enumerate(BROKEN_KINDS):
            folder = os.path.join(root, classes[(i * len(BROKEN_KINDS) + k) % len(classes)])
            name = f"broken-{kind}-{i}.{'png' if kind == 'truncated_png' else 'jpg'}"
            path = os.path.join(folder, name)
            if kind == "dangling_link":
                os.symlink(os.path.join(folder, f"missing-{i}.jpg"), path)
            else:
                data = {
                    "empty": b"",
                    "html": b"<!DOCTYPE html><html><body><h1>404 Not Found</h1></body></html>\n",
                    "random_bytes": rnd.randbytes(4096),
                    "truncated_jpeg": jpeg[: len(jpeg) // 2],
                    "truncated_png": png[: len(png) * 2 // 3],
                }[kind]
                with open(path, "wb") as f:
                    f.write(data)
            written.append(os.path.relpath(path, root))
    return sorted(written)


#: unusual images that are not broken: each must come out as upright 3-channel uint8 RGB
UNUSUAL_KINDS = ("grayscale", "cmyk", "rgba", "palette", "gray16", "exif_rotated")


def add_unusual_images(folder: str | os.PathLike) -> dict[str, str]:
    """Write one image of each of :data:`UNUSUAL_KINDS` into ``folder``; returns kind -> path. The EXIF-rotated
    JPEG is stored 48 wide x 64 high with orientation 6 (shown rotated: 64 wide x 48 high)."""
    from PIL import Image

    files = {
        "grayscale": ("gray.jpg", _encoded("L", "JPEG")),
        "cmyk": ("cmyk.jpg", _encoded("CMYK", "JPEG")),
        "rgba": ("rgba.png", _encoded("RGBA", "PNG")),
        "palette": ("palette.png", _encoded("P", "PNG")),
        "gray16": ("gray16.png", _encoded("I;16", "PNG")),
    }
    exif = Image.Exif()
    exif[0x0112] = 6
    files["exif_rotated"] = ("rotated.jpg", _encoded("RGB", "JPEG", (48, 64), exif=exif.tobytes()))
    paths = {}
    for kind, (name, data) in files.items():
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(data)
        paths[kind] = path
    return paths
