"""Re-forming full batches after bad samples were dropped from them (``bad_samples="skip"``): :class:`Refill` takes
a loader's batches, short ones too, and hands out batches of the full size, each good sample once and in order, as
many as the epoch's length; :class:`Counted` carries a batch's sample count through a DataLoader's pinning thread.
Framework-free; batches of any structure (tensors, lists, dicts) whose first dimension is the sample."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ['Counted', 'Layout', 'Refill', 'batch_layout', 'can_refill']


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
