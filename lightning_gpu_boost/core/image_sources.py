"""An image source is a class-per-folder image tree or an LMDB pack of one: its argument check, its classes (without
listing a single image) and the check that a validation source has the training source's classes."""

from __future__ import annotations

import os
from typing import Any

from lightning_gpu_boost._checks import check_image_folder, check_str
from lightning_gpu_boost.core.lmdb import open_pack
from lightning_gpu_boost.core.lmdb.checks import check_pack

__all__ = ["check_image_source", "check_same_classes", "image_classes"]


def check_image_source(name: str, value: Any, allow_none: bool = False) -> None:
    """An image folder (:func:`~lightning_gpu_boost._checks.check_image_folder`) or an LMDB image pack
    (:func:`~lightning_gpu_boost.core.lmdb.checks.check_pack`)."""
    if value is None and allow_none:
        return
    check_str(name, value)
    if os.path.isdir(value):
        check_image_folder(name, value)
    else:
        check_pack(name, value)


def image_classes(root: str | os.PathLike) -> list[str]:
    """The class names of an image tree (its class folders, sorted, as :func:`scan_image_folder` lists them) or of
    an LMDB image pack (its metadata), without listing a single image."""
    if os.path.isdir(root):
        return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    return list(open_pack(root).meta("classes") or [])


def check_same_classes(train_root: str | os.PathLike, val_root: str | os.PathLike | None) -> None:
    """Raise ``ValueError`` naming ``val_root`` where its classes differ from ``train_root``'s (labels would not
    match)."""
    if val_root is None:
        return
    train, val = image_classes(train_root), image_classes(val_root)
    if train != val:
        differing = sorted(set(train) ^ set(val))
        raise ValueError(
            f"val_root's classes differ from train_root's: {len(val)} against {len(train)} (differing: "
            f"{differing[:5]}{' ...' if len(differing) > 5 else ''}); labels would not match. Give val_root the "
            "class folders of train_root."
        )
