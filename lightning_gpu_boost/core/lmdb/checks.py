"""The argument check of an LMDB pack: a complete pack written by ``lightning-gpu-boost pack``, opened to see that it
is one; each error names the argument, the value and the fix."""

from __future__ import annotations

import os
from typing import Any

from lightning_gpu_boost._checks import check_existing_path, check_str
from lightning_gpu_boost.core.lmdb import open_pack

__all__ = ["check_pack"]


def check_pack(name: str, value: Any, allow_none: bool = False) -> None:
    """A complete LMDB pack written by ``lightning-gpu-boost pack`` (a pack file or a shard manifest), opened to see
    that it is one (its metadata only)."""
    if value is None and allow_none:
        return
    check_str(name, value)
    if not os.path.exists(value) and os.path.exists(f"{value}.partial"):
        raise FileNotFoundError(f"{name} must be a complete LMDB pack, got {str(value)!r}: only {str(value)!r}.partial "
                                f"exists, an interrupted pack; resume it with `lightning-gpu-boost pack SRC {value} "
                                "--resume`.")  # fmt: skip
    check_existing_path(name, value)
    if os.path.isdir(value):
        raise ValueError(f"{name} must be an LMDB pack file, got {str(value)!r} (a folder: pack it with "
                         f"`lightning-gpu-boost pack {value} OUT.lmdb`, or use ImageFolderDataModule).")  # fmt: skip
    try:
        open_pack(value)
    except Exception as err:  # not LMDB, interrupted, damaged metadata: say which argument and why
        raise ValueError(f"{name} must be a complete LMDB pack written by `lightning-gpu-boost pack`, got "
                         f"{str(value)!r}: {err}") from None  # fmt: skip
