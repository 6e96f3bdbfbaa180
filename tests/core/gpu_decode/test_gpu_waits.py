"""How the training process's threads wait for the GPU while DALI decodes (``core/gpu_decode/gpu_waits.py``): the
context's scheduling flags set to blocking waits by the first holder and put back by the last, through a stand-in
for the CUDA driver (the real driver: ``test_on_gpu.py``)."""

from __future__ import annotations

import ctypes

import pytest

from lightning_gpu_boost.core.gpu_decode import gpu_waits


class FakeDriver:
    """The driver calls ``gpu_waits`` makes, on one context whose flags it keeps."""

    def __init__(self, flags: int = 0x10, fail_set: bool = False) -> None:
        self.flags, self.fail_set, self.current, self.retained, self.sets = flags, fail_set, [], 0, []

    def cuDeviceGet(self, out, index):
        out._obj.value = index
        return 0

    def cuDevicePrimaryCtxRetain(self, out, dev):
        self.retained += 1
        out._obj.value = 1234
        return 0

    def cuDevicePrimaryCtxRelease_v2(self, dev):
        self.retained -= 1
        return 0

    def cuCtxPushCurrent_v2(self, ctx):
        self.current.append(ctx)
        return 0

    def cuCtxPopCurrent_v2(self, out):
        self.current.pop()
        return 0

    def cuCtxGetFlags(self, out):
        assert self.current, "no context current"
        out._obj.value = self.flags
        return 0

    def cuCtxSetFlags(self, flags):
        assert self.current, "no context current"
        if self.fail_set:
            return 1
        self.sets.append(flags)
        self.flags = flags
        return 0


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver()
    monkeypatch.setattr(gpu_waits, "_loaded", [fake])
    monkeypatch.setattr(gpu_waits, "_index", lambda device: 0 if str(device).startswith("cuda") else None)
    monkeypatch.setattr(gpu_waits, "_held", {})
    return fake


def test_the_first_holder_blocks_the_waits_and_the_last_puts_the_flags_back(driver):
    assert gpu_waits.context_waits("cuda:0") == "auto"
    assert gpu_waits.hold_blocking_waits("cuda:0")
    assert driver.flags == 0x14  # the scheduling bits set to blocking, the other flags kept
    assert gpu_waits.context_waits("cuda:0") == "blocking"
    assert gpu_waits.hold_blocking_waits("cuda:0")  # a second holder: nothing set again
    assert driver.sets == [0x14]
    gpu_waits.release_blocking_waits("cuda:0")
    assert driver.flags == 0x14  # one holder left
    gpu_waits.release_blocking_waits("cuda:0")
    assert driver.flags == 0x10 and gpu_waits.context_waits("cuda:0") == "auto"
    gpu_waits.release_blocking_waits("cuda:0")  # more releases than holds: nothing
    assert driver.sets == [0x14, 0x10]
    assert driver.retained == 0 and not driver.current  # every retain released, every push popped


def test_a_driver_that_cannot_set_the_flags_changes_nothing(driver):
    driver.fail_set = True
    assert not gpu_waits.hold_blocking_waits("cuda:0")
    assert driver.flags == 0x10 and gpu_waits._held == {}
    gpu_waits.release_blocking_waits("cuda:0")  # nothing held: nothing put back
    assert driver.sets == []


def test_off_a_gpu_or_without_the_driver_call_nothing_is_held(monkeypatch):
    assert not gpu_waits.hold_blocking_waits("cpu")
    assert gpu_waits.context_waits("cpu") is None
    gpu_waits.release_blocking_waits("cpu")
    monkeypatch.setattr(gpu_waits, "_loaded", [None])  # a driver older than CUDA 12.1, or none
    monkeypatch.setattr(gpu_waits, "_index", lambda device: 0)
    assert not gpu_waits.hold_blocking_waits("cuda:0")
    assert gpu_waits.context_waits("cuda:0") is None


def test_the_driver_is_looked_up_once(monkeypatch):
    monkeypatch.setattr(gpu_waits, "_loaded", [])
    calls = []

    def cdll(name):
        calls.append(name)
        raise OSError("no libcuda here")

    monkeypatch.setattr(ctypes, "CDLL", cdll)
    assert gpu_waits._driver() is None and gpu_waits._driver() is None
    assert calls == ["libcuda.so.1"]


def test_dali_windows_on_a_cpu_hold_nothing(monkeypatch):
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliWindows

    held = []
    monkeypatch.setattr("lightning_gpu_boost.core.gpu_decode.dali_windows.hold_blocking_waits",
                        lambda device: held.append(device) or True)  # fmt: skip
    windows = DaliWindows("cpu", threads=1, pipes=1)
    windows._capacity = 4  # the batch size the pipelines are built for (set by the first submit)
    windows._build(0)
    windows.close()
    assert held == [] and windows.waits is None
