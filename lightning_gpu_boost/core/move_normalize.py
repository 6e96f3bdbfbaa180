"""Moving a torchvision dataset's trailing ``ToTensor(), Normalize(mean, std)`` (or the v2 ``ToImage(), ToDtype(float32,
scale=True), Normalize``) out of its workers: they send uint8 images, and :class:`~lightning_gpu_boost.core.prefetch.GPUNormalize`
does the rest on the GPU (``StreamPrefetch(move_normalize=True)``, ``GPUBoost(move_normalize=True)``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lightning_gpu_boost.core.prefetch import as_normalize

__all__ = ['Uint8Transform', 'move_normalize', 'restore_normalize']

def _tv_name(obj: Any) -> str | None:
    """The class name of a torchvision transform (v1 or v2), or None for anything else."""
    cls = type(obj)
    return cls.__name__ if cls.__module__.startswith("torchvision.transforms") else None


def _to_float_scaled(t: Any) -> bool:
    """``ConvertImageDtype(torch.float32)`` or ``ToDtype(torch.float32, scale=True)``: uint8 -> [0, 1] floats."""
    name = _tv_name(t)
    if name == "ConvertImageDtype":
        return getattr(t, "dtype", None) == torch.float32
    return (
        name == "ToDtype" and getattr(t, "dtype", None) == torch.float32 and bool(getattr(t, "scale", False))
    )


def _to_uint8_chw(x: Any) -> torch.Tensor | None:
    """An 8-bit image (PIL in L/RGB/RGBA, HWC uint8 array, CHW uint8 tensor) as a CHW uint8 tensor, else None."""
    if isinstance(x, torch.Tensor):
        return x.as_subclass(torch.Tensor) if x.dtype == torch.uint8 and x.dim() == 3 else None
    if getattr(x, "mode", None) in ("L", "RGB", "RGBA") and hasattr(x, "getbands"):  # a PIL image
        x = np.array(x, dtype=np.uint8)
    elif not (isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim in (2, 3)):
        return None
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.unsqueeze(0) if t.dim() == 2 else t.permute(2, 0, 1)


class Uint8Transform:
    """What :func:`move_normalize` puts in place of a torchvision transform ending in ``ToTensor(), Normalize()``.

    Runs the transforms before them, then returns the image as a CHW uint8 tensor (4x fewer bytes to collate,
    pin and copy); the division by 255 and the normalization run on the GPU (:class:`GPUNormalize` with
    :attr:`mean` and :attr:`std`). Inputs that are not 8-bit images get the original tail, unchanged.
    """

    def __init__(
        self, original: Any, head: list, tail: list, mean: tuple[float, ...], std: tuple[float, ...]
    ) -> None:
        self.original, self.head, self.tail, self.mean, self.std = original, head, tail, mean, std

    def __call__(self, x: Any) -> Any:
        for t in self.head:
            x = t(x)
        out = _to_uint8_chw(x)
        if out is None:
            for t in self.tail:
                x = t(x)
            return x
        return out

    def __repr__(self) -> str:
        inner = "".join(f"\n    {t}" for t in self.head)
        return f"Uint8Transform({inner}\n    -> uint8; on the GPU: /255, Normalize(mean={self.mean}, std={self.std}))"


def _split_normalize_tail(transform: Any) -> tuple[list, list, tuple, tuple] | None:
    """``(head, tail, mean, std)`` if ``transform`` is a torchvision ``Compose`` ending in a float conversion
    (``ToTensor``, or ``ConvertImageDtype``/``ToDtype(float32, scale=True)``) and ``Normalize``."""
    steps = getattr(transform, "transforms", None)
    if _tv_name(transform) != "Compose" or not isinstance(steps, (list, tuple)) or len(steps) < 2:
        return None
    *head, to_float, norm = steps
    if _tv_name(norm) != "Normalize" or not (_tv_name(to_float) == "ToTensor" or _to_float_scaled(to_float)):
        return None
    try:
        mean, std = as_normalize(
            tuple(v.tolist() if isinstance(v, torch.Tensor) else v for v in (norm.mean, norm.std))
        )
    except (TypeError, ValueError, AttributeError):
        return None
    return head, [to_float, norm], mean, std


def move_normalize(dataset: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Move the float conversion and ``Normalize`` of a torchvision dataset's transform to the GPU.

    If ``dataset`` (or the dataset under ``Subset`` wrappers) is a torchvision dataset whose ``transform`` is a
    ``Compose`` ending in ``ToTensor(), Normalize(mean, std)`` (or ``ToImage()/PILToTensor(), ToDtype(float32,
    scale=True)/ConvertImageDtype(float32), Normalize(mean, std)``), its ``transform`` is replaced with a
    :class:`Uint8Transform`: samples leave the workers as uint8 and ``(mean, std)`` is returned, for a
    :class:`GPUNormalize` on the first element of each batch (the image of torchvision's ``(image, target)``).
    Returns ``None`` and changes nothing otherwise. Calling it again on the same dataset returns the same stats.
    """
    dataset = _unwrap_subsets(dataset)
    if not any(c.__module__.startswith("torchvision.datasets") for c in type(dataset).__mro__):
        return None
    transform = getattr(dataset, "transform", None)
    if isinstance(transform, Uint8Transform):
        return transform.mean, transform.std
    split = _split_normalize_tail(transform)
    if split is None:
        return None
    head, tail, mean, std = split
    _set_transform(dataset, transform, Uint8Transform(transform, head, tail, mean, std))
    return mean, std


def restore_normalize(dataset: Any) -> None:
    """Undo :func:`move_normalize`: put the dataset's original transform back (no-op if it was not moved)."""
    dataset = _unwrap_subsets(dataset)
    moved = getattr(dataset, "transform", None)
    if isinstance(moved, Uint8Transform):
        _set_transform(dataset, moved, moved.original)


def _unwrap_subsets(dataset: Any) -> Any:
    while isinstance(dataset, torch.utils.data.Subset):
        dataset = dataset.dataset
    return dataset


def _set_transform(dataset: Any, old: Any, new: Any) -> None:
    dataset.transform = new
    # VisionDataset also keeps StandardTransform(transform, target_transform) as ``transforms``
    joint = getattr(dataset, "transforms", None)
    if getattr(joint, "transform", None) is old:
        joint.transform = new
