"""One name per idea across the front doors; a former name, or any name nobody knows, is refused naming it."""

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


@pytest.mark.parametrize("make,name", [
    (lambda: StreamPrefetch(dtype="bfloat16"), "dtype"),
    (lambda: GPUBoost(gpu_normalize=False), "gpu_normalize"),
    (lambda: AutoNumWorkers(budget_s=5), "budget_s"),
    (lambda: BoostDataModule(auto_budget_s=5), "auto_budget_s"),
    (lambda: BoostDataModule(prefetch=True), "prefetch"),
])  # fmt: skip
def test_an_unknown_or_former_keyword_is_refused_naming_it(make, name):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        make()
