"""The workers' side of the GPU decode: which torchvision pipelines it takes over, and what a sample becomes.

A torchvision ``ImageFolder``/``DatasetFolder`` with the default loader whose ``transform`` is a ``Compose`` of
``RandomResizedCrop``, ``RandomHorizontalFlip``, ``Resize``, ``CenterCrop`` (bilinear, antialiased: what PIL
does), then ``ToTensor``/``PILToTensor``/``ToImage`` + ``ToDtype``/``ConvertImageDtype`` and ``Normalize``
(transforms v1 or v2) is *recognized* (:func:`recognize`). Its loader and transform are then replaced
(:func:`take_over`, undone by :func:`give_back`): the workers read the file's bytes and its header only, draw each
sample's random parameters exactly as the CPU transform would (the same calls on torch's generator, in the same
order), and hand over a :class:`~lightning_gpu_boost.core.gpu_decode.records.Record` that the decoder
(:mod:`~lightning_gpu_boost.core.gpu_decode.decode`) decodes, crops, resizes, flips and normalizes on the GPU. A
share of the samples (:class:`Share`, changed while the workers run) is decoded by the workers instead, with the
same drawn parameters, through torchvision's own functions: the split. While a split is set, each worker keeps off
the first CPUs of its own (:class:`TrainingCpus`): the training thread, the hand-over and DALI's threads run there
instead of waiting behind a worker's decode. A file that is not a JPEG in RGB or grayscale, or whose crop the GPU
cannot do, takes the CPU path for that sample.

Framework-free; torchvision is imported only where a recognized pipeline runs.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from multiprocessing.sharedctypes import RawValue
from typing import Any

import torch

from lightning_gpu_boost.core.gpu_decode.records import Record

__all__ = ["DecodePlan", "EncodedTransform", "LazyImage", "Share", "TrainingCpus", "geometry", "give_back", "recognize",
           "split_worker_cpus", "take_over"]



def _tv(obj: Any) -> str | None:
    cls = type(obj)
    return cls.__name__ if cls.__module__.startswith("torchvision.transforms") else None


@dataclass(frozen=True)
class DecodePlan:
    """A recognized transform: its geometric ``steps`` (the torchvision transforms, in order), the output size,
    and the normalization its tail does."""

    steps: tuple[Any, ...]
    size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]


def _pair(size: Any) -> tuple[int, int] | None:
    if isinstance(size, int):
        return size, size
    if isinstance(size, (list, tuple)) and len(size) == 1:
        return int(size[0]), int(size[0])
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1])
    return None


def _bilinear_aa(t: Any) -> bool:
    mode = getattr(t, "interpolation", None)
    name = getattr(mode, "value", mode)
    return str(name).lower() == "bilinear" and getattr(t, "antialias", True) in (True, None)


def recognize(dataset: Any) -> DecodePlan | None:
    """The :class:`DecodePlan` of ``dataset`` (under ``Subset`` wrappers) where the GPU decode can take it over,
    else ``None`` (see the module's docstring for what is recognized)."""
    from lightning_gpu_boost.core.move_normalize import _split_normalize_tail, _unwrap_subsets

    dataset = _unwrap_subsets(dataset)
    if not any(c.__module__.startswith("torchvision.datasets") for c in type(dataset).__mro__):
        return None
    transform = getattr(dataset, "transform", None)
    if isinstance(transform, EncodedTransform):
        return transform.plan
    try:
        from torchvision.datasets.folder import default_loader, pil_loader
    except ImportError:  # pragma: no cover - torchvision is what made the dataset
        return None
    if getattr(dataset, "loader", None) not in (default_loader, pil_loader) or not hasattr(dataset, "samples"):
        return None
    split = _split_normalize_tail(transform)
    if split is None:
        return None
    head, _, mean, std = split
    size: tuple[int, int] | None = None
    for t in head:
        name = _tv(t)
        if name == "RandomResizedCrop" and _bilinear_aa(t):
            size = _pair(t.size)
        elif name == "Resize" and _bilinear_aa(t) and getattr(t, "max_size", None) is None:
            pair = _pair(t.size)
            if pair is None:
                return None
            size = pair if not (isinstance(t.size, int) or len(t.size) == 1) else None  # shorter side: size unknown
        elif name == "CenterCrop":
            size = _pair(t.size)
        elif name == "RandomHorizontalFlip" or (name in ("ToImage", "PILToTensor") and t is head[-1]):
            pass  # the 8-bit conversion before ToDtype: the decoder's output is 8-bit values too
        else:
            return None
    if size is None or len(mean) != 3:
        return None
    return DecodePlan(tuple(head), size, mean, std)


class Share:
    """The share of samples the GPU decodes, in [0, 1], in shared memory: set in the training process, read by
    the workers at every sample (no restart). Made before the workers start."""

    def __init__(self, value: float = 1.0) -> None:
        self._value = RawValue("d", float(value))

    @property
    def value(self) -> float:
        return float(self._value.value)

    @value.setter
    def value(self, share: float) -> None:
        self._value.value = min(1.0, max(0.0, float(share)))


def reserved_for_training(cpus: int, processes: int = 1) -> int:
    """CPUs a worker leaves to the training processes during a split, of the ``cpus`` it may run on: 3 for each of
    the ``processes`` training on those CPUs (the node's ranks under DDP: every rank's workers keep off the same
    first CPUs), at most a fifth of them. 3 of 16 for one process (H200, ResNet-50, GPU share 0.3: 0.961 of the
    ceiling against 0.916 with the GPU decoding all and 0.949 with the workers at niceness 10 instead, side by side;
    on a host whose workers could not make 70 % of each batch, 0.77-0.81 against 0.92), none below 5 CPUs."""
    return min(3 * max(1, processes), cpus // 5)


def split_worker_cpus(processes: int = 1) -> float:
    """The share of this process's CPUs its loader workers keep during a split (:class:`TrainingCpus`), where
    ``processes`` train on the node's CPUs."""
    from lightning_gpu_boost.core.cpus import usable_cpus

    cpus = usable_cpus()
    return (cpus - reserved_for_training(cpus, processes)) / cpus


class TrainingCpus:
    """A loader worker's CPUs while a split is set (a GPU share strictly between 0 and 1): all but the first
    :func:`reserved_for_training` of its own (for ``processes`` training on the node), given back when the share
    leaves the split. In the training process itself (no workers) nothing changes; where the platform cannot set
    CPUs, nothing either."""

    def __init__(self, processes: int = 1) -> None:
        self.processes = processes
        self._split = False
        self._original: set[int] | None = None

    def apply(self, share: float) -> None:
        """The share the worker read for its next sample."""
        split = 0.0 < share < 1.0
        if split == self._split or torch.utils.data.get_worker_info() is None:
            return  # the training process's copy keeps no state: a worker forked from it starts afresh
        self._split = split
        try:
            if split:
                self._original = os.sched_getaffinity(0)
                cpus = sorted(self._original)
                kept = cpus[reserved_for_training(len(cpus), self.processes):]
                if kept and len(kept) < len(cpus):
                    os.sched_setaffinity(0, kept)
            elif self._original is not None:
                os.sched_setaffinity(0, self._original)
                self._original = None
        except (AttributeError, OSError):  # no affinity on this platform, or the CPUs changed under us
            self._original = None


class LazyImage:
    """What the replaced loader returns: the file's bytes, and PIL's view of its header (nothing decoded)."""

    def __init__(self, path: str) -> None:
        from PIL import Image

        with open(path, "rb") as f:
            self.data = f.read()
        self.path = path
        self.image = Image.open(io.BytesIO(self.data))

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size

    def decoded(self) -> Any:
        """The RGB image, as the default loader gives it."""
        return self.image.convert("RGB")


def lazy_loader(path: str) -> LazyImage:
    return LazyImage(path)


def _draw(plan: DecodePlan, width: int, height: int, probe: Any) -> tuple[list[tuple], bool]:
    """Draw the random parameters of ``plan`` for an image of ``width x height`` (``probe``: a PIL image of that
    size, its header only) as the CPU transform draws them: the operations on the GPU, and whether the GPU can do
    them (a center crop larger than the image pads: the CPU does that)."""
    from torchvision.transforms import functional as F

    ops: list[tuple] = []
    ok = True
    h, w = height, width
    for t in plan.steps:
        name = _tv(t)
        if name == "RandomResizedCrop":
            if hasattr(t, "get_params"):  # v1
                i, j, ch, cw = t.get_params(probe, t.scale, t.ratio)
            else:  # v2
                params = (t.make_params if hasattr(t, "make_params") else t._get_params)([probe])
                i, j, ch, cw = params["top"], params["left"], params["height"], params["width"]
            oh, ow = _pair(t.size)  # type: ignore[misc]
            ops += [("crop", i, j, ch, cw), ("resize", oh, ow)]
            h, w = oh, ow
        elif name == "Resize":
            size = [t.size] if isinstance(t.size, int) else list(t.size)
            oh, ow = F._compute_resized_output_size((h, w), size, None) if len(size) == 1 else size
            ops.append(("resize", oh, ow))
            h, w = oh, ow
        elif name == "CenterCrop":
            ch, cw = _pair(t.size)  # type: ignore[misc]
            if ch > h or cw > w:
                ok = False
            i, j = int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))
            ops.append(("crop", i, j, ch, cw))
            h, w = ch, cw
        elif name == "RandomHorizontalFlip":
            if torch.rand(1).item() < t.p:
                ops.append(("flip",))
    return ops, ok and geometry(height, width, ops) is not None


def geometry(height: int, width: int, ops: list[tuple]) -> tuple[tuple[int, ...], tuple[int, ...], bool] | None:
    """The operations as one resampling per axis: ``((start, length, resized, offset, out) for the rows, the same
    for the columns, flip)``: the source's window ``[start, start + length)`` resized to ``resized`` pixels, of which
    ``[offset, offset + out)`` are kept, then flipped where drawn. ``None`` where the operations are not of that form
    (two resizes, an operation after the flip, a crop outside the image): the worker decodes that sample."""
    axes = [[0, height, None, 0, height], [0, width, None, 0, width]]  # start, length, resized, offset, current
    flip = False
    for op in ops:
        if flip:
            return None
        if op[0] == "crop":
            _, i, j, ch, cw = op
            for ax, start, length in ((axes[0], i, ch), (axes[1], j, cw)):
                if start < 0 or length < 1 or start + length > ax[4]:
                    return None
                if ax[2] is None:
                    ax[0] += start
                    ax[1] = length
                else:
                    ax[3] += start
                ax[4] = length
        elif op[0] == "resize":
            if axes[0][2] is not None:
                return None
            for ax, n in ((axes[0], op[1]), (axes[1], op[2])):
                ax[2] = ax[4] = n
        elif op[0] == "flip":
            flip = True
    rows, cols = ((a, n, n if r is None else r, c, cur) for a, n, r, c, cur in axes)
    return rows, cols, flip


def _run_on_cpu(plan: DecodePlan, image: Any, ops: list[tuple]) -> torch.Tensor:
    """The plan's steps on the decoded PIL image with the drawn parameters, through torchvision's functions (what
    the CPU transform computes): CHW uint8."""
    from torchvision.transforms import functional as F

    from lightning_gpu_boost.core.move_normalize import _to_uint8_chw

    todo = list(ops)
    for t in plan.steps:
        name = _tv(t)
        if name == "RandomResizedCrop":
            _, i, j, ch, cw = todo.pop(0)
            _, oh, ow = todo.pop(0)
            image = F.resized_crop(image, i, j, ch, cw, [oh, ow], F.InterpolationMode.BILINEAR, antialias=True)
        elif name == "Resize":
            _, oh, ow = todo.pop(0)
            image = F.resize(image, [oh, ow], F.InterpolationMode.BILINEAR, antialias=True)
        elif name == "CenterCrop":
            todo.pop(0)
            image = F.center_crop(image, list(_pair(t.size)))  # type: ignore[arg-type]
        elif name == "RandomHorizontalFlip" and todo and todo[0][0] == "flip":
            todo.pop(0)
            image = F.hflip(image)
        elif name in ("ToImage", "PILToTensor"):
            break
    out = _to_uint8_chw(image)
    assert out is not None
    return out


class EncodedTransform:
    """The workers' transform while the GPU decodes: draw the parameters, then pack the JPEG (a share
    :attr:`share` of the samples) or decode on the CPU with those parameters and pack the pixels."""

    def __init__(self, original: Any, plan: DecodePlan, share: Share, loader: Any = None, processes: int = 1) -> None:
        self.original, self.plan, self.share = original, plan, share
        self.loader = loader  # the dataset's own loader, put back by give_back
        self._credit = 0.0
        self._cpus = TrainingCpus(processes)

    def __call__(self, sample: Any) -> Any:
        if not isinstance(sample, LazyImage):  # not from our loader (a user calling the transform): as before
            return self.original(sample)
        w, h = sample.size
        ops, gpu_can = _draw(self.plan, w, h, sample.image)
        jpeg = sample.image.format == "JPEG" and sample.image.mode in ("RGB", "L")
        share = self.share.value
        self._cpus.apply(share)
        self._credit += share
        if gpu_can and jpeg and self._credit >= 1.0 - 1e-9:
            self._credit -= 1.0
            g = geometry(h, w, ops)
            flat = None if g is None else (*g[0], *g[1], int(g[2]))
            return Record(jpeg=sample.data, ops=ops, share=share, geometry=flat)
        return Record(pixels=_run_on_cpu(self.plan, sample.decoded(), ops), share=share)

    def fingerprint(self) -> str:
        """What the workers' cost per sample depends on (the worker probe's cache key): the GPU share."""
        return f"EncodedTransform(GPU share {self.share.value:.2f})"

    def __repr__(self) -> str:
        return f"EncodedTransform({self.original!r}, GPU share {self.share.value:.2f})"


def take_over(dataset: Any, share: Share, processes: int = 1) -> DecodePlan | None:
    """Replace the recognized ``dataset``'s loader and transform (see the module's docstring); the plan, or
    ``None`` with nothing changed. ``processes``: the training processes on the node (:class:`TrainingCpus`)."""
    from lightning_gpu_boost.core.move_normalize import _set_transform, _unwrap_subsets

    plan = recognize(dataset)
    if plan is None:
        return None
    inner = _unwrap_subsets(dataset)
    if not isinstance(inner.transform, EncodedTransform):
        encoded = EncodedTransform(inner.transform, plan, share, loader=inner.loader, processes=processes)
        inner.loader = lazy_loader
        _set_transform(inner, inner.transform, encoded)
    return plan


def give_back(dataset: Any) -> None:
    """Undo :func:`take_over` (no-op where it did nothing)."""
    from lightning_gpu_boost.core.move_normalize import _set_transform, _unwrap_subsets

    inner = _unwrap_subsets(dataset)
    encoded = getattr(inner, "transform", None)
    if isinstance(encoded, EncodedTransform):
        _set_transform(inner, encoded, encoded.original)
        inner.loader = encoded.loader
