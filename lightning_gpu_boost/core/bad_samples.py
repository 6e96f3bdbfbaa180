"""Bad samples: found cheaply where bytes are read, named by their original path, skipped or raised by policy.

Framework-free: :func:`check_image` (used by ``pack`` in its reading threads and by the DALI feeder),
:class:`BadSample` (what a dataset returns in place of a sample it cannot decode under ``bad_samples="skip"``),
:class:`SkipBadCollate` (drops them from the batch) and :class:`BadSampleTracker` (counts them across DataLoader
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

__all__ = ['BROKEN_KINDS', 'BadSample', 'BadSampleError', 'BadSampleLog', 'BadSampleTracker', 'CHECK_LEVELS', 'CheckLevel', 'Counted', 'Layout', 'POLICIES', 'Refill', 'SkipBadCollate', 'UNUSUAL_KINDS', 'add_broken_files', 'add_unusual_images', 'bad_sample_error', 'batch_layout', 'can_refill', 'check_file', 'check_image', 'decode_problem', 'describe']

CheckLevel = Literal["structure", "decode"]
CHECK_LEVELS = ("structure", "decode")
POLICIES = ("raise", "skip")

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


class BadSampleError(RuntimeError):
    """A sample that cannot be read or decoded; the message names its original path and the fix."""


def _jpeg_problem(data: bytes | memoryview) -> str | None:
    n, i, frame = len(data), 2, False
    while i < n:
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
        if marker == 0xDA:  # start of scan: the compressed data follows, then (eventually) the end marker
            if not frame:
                return "damaged JPEG: image data without a frame header"
            if bytes(data[-2:]) == b"\xff\xd9" or bytes(data).find(b"\xff\xd9", i + length) >= 0:
                return None
            return "truncated JPEG: no end-of-image marker after the image data"
        i += length
    return f"truncated JPEG: the file ends inside its headers ({n} bytes)"


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
    if head[:3] == b"\xff\xd8\xff":
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


# ----------------------------------------------------------------------------- full batches after skipped samples

#: layout leaves: ``"B"`` an array whose first dimension is the batch, ``"L"`` a list of samples, ``"C"`` anything
#: else (a per-batch value, padding that depends on the batch's samples): a batch holding one cannot be re-formed
Layout = Any


def batch_layout(one: Any, full: Any, n: int) -> Layout:
    """Which parts of the collated batch ``full`` (of ``n >= 2`` samples) carry the batch dimension, found by
    comparing it with one sample collated alone (``one``): arrays whose first dimension goes 1 -> n with the rest
    of the shape unchanged are ``"B"``, lists that go 1 -> n entries are lists of samples (``"L"``), containers of
    the same keys or length are walked, and everything else is ``"C"``."""
    shape_one, shape_full = getattr(one, "shape", None), getattr(full, "shape", None)
    if shape_one is not None and shape_full is not None and type(one) is type(full):
        ok = len(shape_full) >= 1 and shape_full[0] == n and shape_one[0] == 1 and shape_full[1:] == shape_one[1:]
        return "B" if ok else "C"
    if isinstance(full, dict) and isinstance(one, dict):
        if full.keys() != one.keys():
            return "C"
        return {k: batch_layout(one[k], full[k], n) for k in full}
    if isinstance(full, (list, tuple)) and isinstance(one, (list, tuple)) and type(one) is type(full):
        if len(one) == 1 and len(full) == n:
            return "L"
        if len(one) == len(full):
            return [batch_layout(a, b, n) for a, b in zip(one, full, strict=True)]
    return "C"


def can_refill(layout: Layout) -> bool:
    if isinstance(layout, dict):
        return bool(layout) and all(can_refill(v) for v in layout.values())
    if isinstance(layout, list):
        return bool(layout) and all(can_refill(v) for v in layout)
    return layout in ("B", "L")


def _signature(batch: Any, layout: Layout) -> tuple:
    """What must agree between batches cut and joined together: each array's dtype, device and shape past the
    batch dimension (a collate that pads to its batch's longest sample can look cuttable on one batch alone)."""
    if layout == "L":
        return ("L",)
    if layout == "B":
        return (type(batch).__name__, str(batch.dtype), tuple(batch.shape[1:]), str(getattr(batch, "device", "")))
    if isinstance(layout, dict):
        return tuple((k, _signature(batch[k], layout[k])) for k in layout)
    return tuple(_signature(b, sub) for b, sub in zip(batch, layout, strict=True))


def _take(batch: Any, layout: Layout, start: int, stop: int) -> Any:
    if layout in ("B", "L"):
        return batch[start:stop]
    if isinstance(layout, dict):
        return type(batch)((k, _take(batch[k], layout[k], start, stop)) for k in batch)
    parts = [_take(b, sub, start, stop) for b, sub in zip(batch, layout, strict=True)]
    return type(batch)(*parts) if hasattr(batch, "_fields") else type(batch)(parts)


def _join(batches: list[Any], layout: Layout) -> Any:
    first = batches[0]
    if len(batches) == 1:
        return first
    if layout == "L":
        return type(first)(x for b in batches for x in b)
    if layout == "B":
        import torch

        if isinstance(first, torch.Tensor):
            if first.device.type == "cpu" and all(b.is_pinned() for b in batches):  # stay page-locked
                out = torch.empty((sum(len(b) for b in batches), *first.shape[1:]), dtype=first.dtype,
                                  pin_memory=True)  # fmt: skip
                return torch.cat(batches, out=out)
            return torch.cat(batches)
        import numpy as np

        return np.concatenate(batches)
    if isinstance(layout, dict):
        return type(first)((k, _join([b[k] for b in batches], layout[k])) for k in first)
    parts = [_join([b[i] for b in batches], sub) for i, sub in enumerate(layout)]
    return type(first)(*parts) if hasattr(first, "_fields") else type(first)(parts)


@dataclass
class Counted:
    """A collated batch with its sample count and :func:`batch_layout` (``None`` where it holds one sample), as
    :class:`SkipBadCollate` sends it to :class:`Refill`."""

    batch: Any
    n: int
    layout: Layout

    def pin_memory(self, device: Any = None) -> Counted:  # the DataLoader's pinning thread calls this
        from torch.utils.data._utils.pin_memory import pin_memory

        return Counted(None if self.batch is None else pin_memory(self.batch, device), self.n, self.layout)


class Refill:
    """Re-forms full batches where skipped samples left some short: a batch ``k`` short takes the first ``k``
    samples of the next, and so on, so every batch but the epoch's last holds ``batch_size`` samples and every
    good sample comes exactly once, in order. The number of batches stays ``expected`` (the loader's ``len()``:
    under DDP every rank must run the same number of steps): one full batch is held back once batches are being
    re-formed, and at the end the samples left are spread over the batches still owed.

    Batches pass through untouched until the first short one. Batches that cannot be re-formed (a part without a
    batch dimension, padding that depends on its samples, shapes that differ between batches) are passed on as
    they came, short ones too, with one warning; re-forming stops for the rest of the iteration.

    Resumable: :meth:`position` says where the iteration stands after the batch it handed out last (the source
    batch to read again first, how many of its good samples were already handed out, the batches handed out, and at
    the epoch's end the sizes still owed); an iteration whose source starts at ``position["source"]`` and that is
    given ``resume=position`` hands out exactly the batches the first one would have handed out next.

    Args:
        batches: an iterable of :class:`Counted` batches (anything else passes through).
        batch_size: the samples per full batch.
        expected: how many batches the epoch has (``None``: unknown, e.g. an iterable dataset).
        warn: called once with a message where batches cannot be re-formed.
        resume: a :meth:`position` of an earlier iteration of the same epoch, whose source begins at its
            ``"source"`` batch.
    """

    def __init__(
        self, batches: Any, batch_size: int, expected: int | None = None, warn: Callable[[str], Any] | None = None,
        resume: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.batches, self.batch_size, self.expected, self.warn = batches, batch_size, expected, warn
        self.resume = resume
        self._warned = False
        #: batches re-formed in the last iteration (0 where nothing was skipped)
        self.reformed = 0
        self._at: dict[str, Any] = {"emitted": 0, "source": 0, "drop": 0, "tail": None, "refilling": False,
                                    "given_up": False}  # fmt: skip

    def position(self) -> dict[str, Any]:
        """Where the iteration stands after the batch it handed out last (see the class docstring)."""
        return dict(self._at)

    def __iter__(self):
        size, expected = self.batch_size, self.expected
        resume = self.resume or {}
        base, drop = int(resume.get("source", 0)), int(resume.get("drop", 0))
        emitted = int(resume.get("emitted", 0))
        refilling, given_up = bool(resume.get("refilling")), bool(resume.get("given_up"))
        tail: list[int] | None = list(resume["tail"]) if resume.get("tail") is not None else None
        self.reformed = 0
        received = base
        counts: list[int] = []  # good samples of each source batch received in this iteration (after ``drop``)
        parts: list[Any] = []  # (batch, n) not yet handed out, oldest first
        ready: list[Any] = []  # full batches formed, the last one held back
        buffered = 0  # samples in parts
        layout: Layout = None
        reference: tuple | None = None  # the signature every batch cut and joined must share

        def mark(sizes: list[int] | None = None) -> None:
            """Record the place after a batch handed out: the held samples are the last ones received."""
            held = buffered + size * len(ready)
            source, first_drop, acc = received, 0, 0
            i = len(counts)
            while acc < held and i > 0:
                i -= 1
                acc += counts[i]
            if held:
                source, first_drop = base + i, acc - held + (drop if i == 0 else 0)
            self._at = {"emitted": emitted, "source": source, "drop": first_drop, "tail": sizes,
                        "refilling": refilling, "given_up": given_up}  # fmt: skip

        self._at = {"emitted": emitted, "source": base, "drop": drop, "tail": tail, "refilling": refilling,
                    "given_up": given_up}  # fmt: skip
        for item in self.batches:
            received += 1
            if isinstance(item, Counted) and received == base + 1 and drop:
                # the first source batch read again: its first ``drop`` good samples were handed out before
                if item.layout is not None:
                    layout = item.layout
                n = item.n - min(drop, item.n)
                item = Counted(_take(item.batch, item.layout, item.n - n, item.n) if n else None, n,
                               item.layout if n > 1 else None)  # fmt: skip
            counts.append(item.n if isinstance(item, Counted) else 0)
            if not isinstance(item, Counted):
                emitted += 1
                mark()
                yield item
                continue
            if item.layout is not None:
                layout = item.layout
            n = item.n
            if tail is not None:  # resumed inside the epoch's end: gather what is left, cut it as planned
                if n > 0:
                    parts.append((item.batch, n))
                    buffered += n
                continue
            # a batch of one sample (or none) says no layout: cuttable until a batch that says one comes
            known = layout is not None and can_refill(layout) and (item.layout is None or n < 2
                                                                   or can_refill(item.layout))  # fmt: skip
            cuttable = not given_up and (known or (layout is None and n < 2))
            if refilling and n > 0 and (
                not cuttable or (reference is not None and _signature(item.batch, layout) != reference)
            ):
                # this batch cannot join the others: hand out what is held as it is, then pass batches on
                held = ready + [batch for batch, _ in parts]
                ready, parts, buffered, refilling, given_up, cuttable = [], [], 0, False, True, False
                self._warn_once()
                for k, batch in enumerate(held):
                    emitted += 1
                    self._at = {**self._at, "emitted": emitted}
                    if k == len(held) - 1:
                        mark()
                    yield batch
            if not refilling:
                last = expected is not None and received >= expected
                if n == size or (last and n > 0):
                    emitted += 1
                    mark()
                    yield item.batch
                    continue
                if not cuttable:
                    self._warn_once()
                    if n > 0:
                        emitted += 1
                        mark()
                        yield item.batch
                    continue
                refilling = True
            if n > 0:
                if reference is None and layout is not None:
                    reference = _signature(item.batch, layout)
                parts.append((item.batch, n))
                buffered += n
            while buffered >= size and layout is not None:
                ready.append(self._cut(parts, size, layout))
                buffered -= size
            while len(ready) > 1:
                emitted += 1
                self.reformed += 1
                batch = ready.pop(0)
                mark()
                yield batch
        if tail is None and not refilling:
            return
        # what is left: the held-back batch and the rest, spread over the batches still owed
        if ready:
            parts.insert(0, (ready.pop(), size))
            buffered += size
        if tail is None:
            if not buffered:
                return
            owed = max(1, (expected - emitted) if expected is not None else -(-buffered // size))
            tail = self._sizes(buffered, owed, size)
            if owed > buffered and self.warn is not None:
                self.warn(f"Too many bad samples: this epoch has {owed - buffered} batch(es) fewer than its length.")
        if layout is None:  # only batches of one sample came: nothing tells how to join them
            tail = [n for _, n in parts]
        for j, k in enumerate(tail):
            self.reformed += 1
            batch = self._cut(parts, k, layout) if layout is not None else parts.pop(0)[0]
            buffered -= k
            emitted += 1
            mark(tail[j + 1 :])
            yield batch

    def _warn_once(self) -> None:
        if self.warn is not None and not self._warned:
            self._warned = True
            self.warn(
                "Skipped bad samples left a batch short, and its batches cannot be re-formed (a part without a batch "
                "dimension, padding that depends on the samples, shapes that differ between batches): batches are "
                "passed on as they come, short ones too."
            )

    @staticmethod
    def _sizes(total: int, owed: int, size: int) -> list[int]:
        """``owed`` batch sizes summing to ``total``: full batches first where that leaves each batch a sample."""
        if owed <= 1:
            return [total]
        if total >= (owed - 1) * size + 1:
            return [size] * (owed - 1) + [total - (owed - 1) * size]
        if total < owed:
            return [1] * total
        base, extra = divmod(total, owed)
        return [base + 1] * extra + [base] * (owed - extra)

    @staticmethod
    def _cut(parts: list[Any], k: int, layout: Layout) -> Any:
        """The first ``k`` samples of ``parts`` as one batch (removed from ``parts``)."""
        taken, need = [], k
        while need:
            batch, n = parts[0]
            if n <= need:
                taken.append(batch)
                parts.pop(0)
                need -= n
            else:
                taken.append(_take(batch, layout, 0, need))
                parts[0] = (_take(batch, layout, need, n), n - need)
                need = 0
        return _join(taken, layout)


# ------------------------------------------------------------------------------------------- test material

#: the kinds of broken file :func:`add_broken_files` writes (what real datasets hold)
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
