"""Python's switch interval, shortened while the GPU decode's hand-over thread shares the GIL with the training
thread (``core/switch_interval.py``): set, put back, overlapping uses, a user's own setting left alone."""

from __future__ import annotations

import sys

import pytest

from lightning_gpu_boost.core.switch_interval import shorten_switch_interval


@pytest.fixture(autouse=True)
def _python_default():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_the_interval_is_shortened_and_put_back_once():
    restore = shorten_switch_interval(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    restore()
    assert sys.getswitchinterval() == pytest.approx(0.005)
    sys.setswitchinterval(0.002)
    restore()  # a second call does nothing
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_a_longer_interval_or_none_leaves_the_users_one():
    sys.setswitchinterval(0.0002)
    restore = shorten_switch_interval(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    restore()
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    shorten_switch_interval(None)()
    assert sys.getswitchinterval() == pytest.approx(0.0002)


def test_overlapping_uses_put_it_back_when_the_last_ends():
    first, second = shorten_switch_interval(0.0005), shorten_switch_interval(0.0005)
    first()
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    second()
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_an_interval_the_user_set_meanwhile_stands():
    restore = shorten_switch_interval(0.0005)
    sys.setswitchinterval(0.001)
    restore()
    assert sys.getswitchinterval() == pytest.approx(0.001)


@pytest.mark.parametrize("seconds", [0, -1.0, True, "0.5"])
def test_a_wrong_interval_is_refused_naming_it(seconds):
    with pytest.raises(ValueError, match=r"seconds must be a positive number or None, got"):
        shorten_switch_interval(seconds)
