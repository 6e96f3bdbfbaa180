"""Argument checks shared by every public constructor: each error names the argument, the value and what is valid.

A bool is a bool (no truthy strings, no 0/1), an int is an int (no floats, no bools), numbers are finite, paths
that must exist exist and output paths can be written, all at construction, before any training starts.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ['check_bool', 'check_callable', 'check_choice', 'check_dict', 'check_existing_path', 'check_image_folder', 'check_int', 'check_normalize', 'check_number', 'check_pair', 'check_str', 'check_writable_file']


def _bad(name: str, value: Any, valid: str, error: type[Exception] = ValueError) -> Exception:
    return error(f"{name} must be {valid}, got {value!r}.")


def check_bool(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, bool):
        raise _bad(name, value, "True or False" + (" or None" if allow_none else ""))


def check_int(
    name: str, value: Any, low: int | None = None, high: int | None = None, allow_none: bool = False
) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low) or (
        high is not None and value > high
    ):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise _bad(name, value, f"an int {bounds}" + (" or None" if allow_none else ""))


def check_number(
    name: str, value: Any, low: float | None = None, high: float | None = None, low_open: bool = False,
    high_open: bool = False, allow_none: bool = False,
) -> None:  # fmt: skip
    if value is None and allow_none:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        if low is not None and high is not None:
            valid = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            valid = f"a number {'>' if low_open else '>='} {low:g}"
        elif high is not None:
            valid = f"a number {'<' if high_open else '<='} {high:g}"
        else:
            valid = "a finite number"
        raise _bad(name, value, valid + (" or None" if allow_none else ""))


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if not isinstance(value, (str, int)) or isinstance(value, bool) or value not in choices:
        raise _bad(name, value, "one of " + ", ".join(repr(c) for c in choices))


def check_pair(name: str, value: Any, low: float = 0.0, high: float | None = None, ordered: bool = True) -> None:
    """Two finite numbers ``(a, b)`` with ``low < a`` (``a <= b`` where ``ordered``; ``b <= high`` where given)."""
    ok = isinstance(value, (tuple, list)) and len(value) == 2
    if ok:
        a, b = value
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (a, b))
        ok = ok and a > low and (not ordered or a <= b) and (high is None or b <= high)
    if not ok:
        upper = f" <= {high:g}" if high is not None else ""
        raise _bad(name, value, f"two numbers (low, high) with {low:g} < low <= high{upper}")


def check_normalize(name: str, value: Any, allow_none: bool = True) -> None:
    """``(mean, std)``: two equal-length sequences of finite numbers, every std > 0."""
    if value is None and allow_none:
        return
    ok = isinstance(value, (tuple, list)) and len(value) == 2
    if ok:
        mean, std = value
        ok = isinstance(mean, (tuple, list)) and isinstance(std, (tuple, list)) and len(mean) == len(std) >= 1
        numbers = list(mean) + list(std) if ok else []
        ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                        for v in numbers) and all(s > 0 for s in std)  # fmt: skip
    if not ok:
        raise _bad(name, value, "(mean, std): two sequences of finite numbers of equal length, every std > 0")


def check_str(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise _bad(name, value, "a non-empty path or string" + (" or None" if allow_none else ""))


def check_existing_path(name: str, value: Any, allow_none: bool = False) -> None:
    """A file or folder that exists now."""
    if value is None and allow_none:
        return
    check_str(name, value)
    if not os.path.exists(value):
        raise FileNotFoundError(f"{name} must be an existing file or folder, got {str(value)!r} (it does not exist).")


def check_writable_file(name: str, value: Any, allow_none: bool = True) -> None:
    """An output file whose folder exists and takes a new file (tried: a temporary file is made and removed there),
    and that is not a folder itself."""
    if value is None and allow_none:
        return
    check_str(name, value)
    path = Path(value).expanduser()
    if path.is_dir():
        raise ValueError(f"{name} must be a file, got {str(value)!r} (a folder).")
    folder = path.resolve().parent
    if not folder.is_dir():
        raise ValueError(f"{name} must be a file in an existing, writable folder, got {str(value)!r} ({str(folder)!r} "
                         "does not exist).")  # fmt: skip
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".lgb-write-check-"):
            pass
    except OSError as err:
        raise ValueError(f"{name} must be a file in an existing, writable folder, got {str(value)!r} ({str(folder)!r} "
                         f"takes no new file: {err.strerror or err}).") from None  # fmt: skip


def check_image_folder(name: str, value: Any, allow_none: bool = False) -> None:
    """A class-per-folder image tree: an existing folder with at least one class folder (``root/<class>/<image>``);
    the images themselves are listed when the dataset is built."""
    if value is None and allow_none:
        return
    check_existing_path(name, value)
    if not os.path.isdir(value):
        raise ValueError(f"{name} must be a class-per-folder image tree (root/<class>/<image>), got {str(value)!r} "
                         "(a file; an LMDB pack goes to LMDBDataModule).")  # fmt: skip
    with os.scandir(value) as entries:
        has_class = any(e.is_dir() and not e.name.startswith(".") for e in entries)
    if not has_class:
        raise ValueError(f"{name} must be a class-per-folder image tree (root/<class>/<image>), got {str(value)!r} "
                         "(it holds no class folder).")  # fmt: skip


def check_callable(name: str, value: Any, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not callable(value):
        raise _bad(name, value, "a callable" + (" or None" if allow_none else ""))


def check_dict(name: str, value: Any, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _bad(name, value, "a dict with str keys" + (" or None" if allow_none else ""))
