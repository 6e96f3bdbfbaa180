"""Every public constructor refuses every wrong value at construction, naming the argument (hypothesis draws them)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.constructor_cases import cases, outcome


@pytest.fixture(scope="module")
def all_cases(tmp_path_factory):
    from lightning_gpu_boost.core.images import make_jpeg_folder
    from lightning_gpu_boost.core.lmdb import pack_image_folder

    root = tmp_path_factory.mktemp("constructors")
    tree = make_jpeg_folder(root / "src", n=8, num_classes=2, size_range=(40, 60, 40, 60), workers=1, progress=False)
    pack = pack_image_folder(tree, root / "pack.lmdb", progress=False)
    return list(cases(tree, pack))


def test_every_wrong_value_is_refused_at_construction_naming_its_argument(all_cases):
    assert len(all_cases) >= 200
    failures = [(c.__name__, arg, wrong, result) for c, valid, arg, wrong in all_cases
                if (result := outcome(c, valid, arg, wrong)) != "named"]  # fmt: skip
    assert not failures, failures[:10]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_wrong_ints_are_refused(all_cases, data):
    """For every int argument: negative ints, non-integral floats, strings and bools drawn at random are refused."""
    wrongs: dict = {}
    for c, valid, arg, wrong in all_cases:
        wrongs.setdefault((c, arg), (valid, []))[1].append(wrong)
    ints = {key: valid for key, (valid, ws) in wrongs.items()  # the int arguments: 2.5 and a negative int are wrong
            if 2.5 in ws and any(type(w) is int and w < 0 for w in ws)}  # fmt: skip
    cls, arg = data.draw(st.sampled_from(sorted(ints, key=lambda k: (k[0].__name__, k[1]))))
    wrong = data.draw(st.one_of(
        st.integers(max_value=-1),
        st.floats().filter(lambda x: x != x or abs(x) == float("inf") or x != int(x)),
        st.text(max_size=4),
        st.booleans(),
    ))  # fmt: skip
    result = outcome(cls, ints[(cls, arg)], arg, wrong)
    assert result == "named", (cls.__name__, arg, wrong, result)
