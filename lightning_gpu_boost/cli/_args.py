"""Argument types of the command line: a wrong value is refused while the line is parsed, before any work, in one
line that names the option, the value and what is valid (argparse adds the option's name)."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["OneLineParser", "at_least", "between", "positive_float", "writable_folder"]

SEED_MAX = 2**64 - 1  # what the packs' metadata (msgpack) and numpy's generators hold


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``PROG: error: ...``, exit 2), without the usage block;
    ``--help`` still shows it."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def at_least(low: int) -> Callable[[str], int]:
    """An int ``>= low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an int >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an int >= {low}, got {value}")
        return value

    parse.__name__ = f"int >= {low}"
    return parse


def between(low: int, high: int) -> Callable[[str], int]:
    """An int in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an int in [{low}, {high}], got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an int in [{low}, {high}], got {value}")
        return value

    parse.__name__ = f"int in [{low}, {high}]"
    return parse


def positive_float(text: str) -> float:
    """A number ``> 0``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {value:g}")
    return value


def writable_folder(name: str, path: str) -> None:
    """Raise ``SystemExit`` (one line) unless ``path`` is a folder that exists or can be made, and takes new files."""
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".lgb-write-check-"):  # tried, as check_writable_file does
            pass
    except OSError as err:
        raise SystemExit(f"{name} {path!r} must be a folder that can be made and written: "
                         f"{err.strerror or err}.") from None  # fmt: skip
