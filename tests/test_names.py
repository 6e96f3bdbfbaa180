"""One name per idea across the front doors: the old names still work for a while, with a deprecation warning naming
the new one; a name nobody knows is refused."""

from __future__ import annotations

import pytest

from lightning_gpu_boost.callbacks import AutoNumWorkers, GPUBoost, StreamPrefetch
from lightning_gpu_boost.datamodules import BoostDataModule


def test_the_same_setting_has_the_same_name_everywhere():
    import inspect

    assert "normalize_dtype" in inspect.signature(GPUBoost).parameters
    assert "normalize_dtype" in inspect.signature(StreamPrefetch).parameters
    assert "move_normalize" in inspect.signature(GPUBoost).parameters
    assert "move_normalize" in inspect.signature(StreamPrefetch).parameters
    for cls in (GPUBoost, AutoNumWorkers, BoostDataModule):
        assert "workers_budget_s" in inspect.signature(cls).parameters, cls


@pytest.mark.parametrize("make,new,value", [
    (lambda: StreamPrefetch(dtype="bfloat16"), "normalize_dtype", "bfloat16"),
    (lambda: GPUBoost(gpu_normalize=False), "move_normalize", False),
    (lambda: AutoNumWorkers(budget_s=5), "workers_budget_s", 5),
    (lambda: BoostDataModule(auto_budget_s=5), "workers_budget_s", 5),
])  # fmt: skip
def test_old_names_still_work_with_a_deprecation_warning(make, new, value):
    with pytest.warns(DeprecationWarning, match=f"is now .*{new}="):
        obj = make()
    if new == "move_normalize":
        assert obj.parts["prefetch"].move_normalize is value
    else:
        assert getattr(obj, new) == value


def test_an_unknown_keyword_is_refused_naming_it():
    with pytest.raises(TypeError, match="'budget'"):
        AutoNumWorkers(budget=5)
    with pytest.raises(ValueError, match="give workers_budget_s only"):
        AutoNumWorkers(budget_s=5, workers_budget_s=7)
