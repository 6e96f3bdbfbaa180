"""Argument checks (``_checks.py``): every error names the argument, its value and what is valid."""

from __future__ import annotations

import pytest

from lightning_gpu_boost import _checks as checks


@pytest.mark.parametrize(
    "check, args, match",
    [
        (checks.check_bool, ("pin", 1), r"pin must be True or False, got 1"),
        (checks.check_int, ("depth", 0), r"depth must be an int >= 1|depth must be"),
        (checks.check_number, ("budget", -1.0), r"budget must be a number"),
        (checks.check_choice, ("mode", "fast", ("a", "b")), r"mode must be one of 'a', 'b', got 'fast'"),
        (checks.check_normalize, ("normalize", ((0.5,), (0.0,))), r"normalize"),
        (checks.check_callable, ("collate_fn", 3), r"collate_fn"),
        (checks.check_str, ("name", 3), r"name"),
    ],
)
def test_each_error_names_the_argument_and_its_value(check, args, match):
    kwargs = {"low": 1} if check is checks.check_int else {"low": 0.0, "low_open": True} if check is checks.check_number else {}
    with pytest.raises((ValueError, TypeError), match=match):
        check(*args, **kwargs)


def test_good_values_pass():
    checks.check_bool("pin", None, allow_none=True)
    checks.check_int("depth", 2, low=1)
    checks.check_choice("mode", "a", ("a", "b"))
    checks.check_normalize("normalize", ((0.5, 0.5, 0.5), (0.2, 0.2, 0.2)))
    checks.check_callable("collate_fn", len)


def test_paths_are_checked_for_what_they_must_be(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises((ValueError, FileNotFoundError, NotADirectoryError), match="root"):
        checks.check_image_folder("root", str(tmp_path / "file.txt"))
    with pytest.raises((ValueError, FileNotFoundError), match="root"):
        checks.check_image_folder("root", str(tmp_path / "missing"))
    with pytest.raises((ValueError, IsADirectoryError), match="cache_path"):
        checks.check_writable_file("cache_path", str(tmp_path))
    checks.check_writable_file("cache_path", str(tmp_path / "new.json"))
    assert not (tmp_path / "new.json").exists()  # tried with a temporary file, nothing left behind
