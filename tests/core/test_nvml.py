"""NVMLSampler against a stand-in for pynvml: the driver's buffered samples keep their own time stamps, the samples
buffered before the sampler started are left out, and a settled mean leaves out the period before ``since``."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest

from lightning_gpu_boost.core.nvml import NVMLSampler

PERIOD = 0.05


class FakeDriver:
    """A GPU whose driver buffers one utilization sample every PERIOD seconds: 0 % before ``busy_from`` (wall
    time), 100 % after."""

    NVML_GPU_UTILIZATION_SAMPLES = 1

    def __init__(self, busy_from: float) -> None:
        self.busy_from = busy_from
        self.first = time.time() - 2.0  # two seconds of history before the sampler starts

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=50)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=1, total=4)

    def nvmlDeviceGetSamples(self, handle, kind, last_seen_us):
        now, samples, t = time.time(), [], self.first
        while t <= now:
            stamp = int(t * 1e6)
            if stamp > last_seen_us:
                value = 100 if t - PERIOD >= self.busy_from else 0
                samples.append(types.SimpleNamespace(timeStamp=stamp, sampleValue=types.SimpleNamespace(uiVal=value)))
            t += PERIOD
        return 0, samples


@pytest.fixture
def driver(monkeypatch):
    fake = FakeDriver(busy_from=time.time() + 0.3)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_samples_keep_the_drivers_stamps_and_skip_history(driver):
    start = time.monotonic()
    with NVMLSampler(interval=0.01) as sampler:
        time.sleep(0.8)
    assert sampler.available
    stamps = [t for t, _ in sampler.util]
    assert stamps and min(stamps) >= start - 0.01  # the two seconds buffered before start are left out
    assert sampler.sample_period() == pytest.approx(PERIOD, rel=0.05)


def test_settled_mean_leaves_out_the_period_before_the_window(driver):
    with NVMLSampler(interval=0.01) as sampler:
        time.sleep(0.8)
    busy_from = driver.busy_from - time.time() + time.monotonic()
    # the sample stamped one period after busy_from still covers idle time; settle leaves it out
    assert sampler.mean_util(since=busy_from, settle=True) == 100
    assert sampler.mean_util(since=busy_from - 2 * PERIOD) < 100


class _Metric:
    def __init__(self) -> None:
        self.metricId, self.nvmlReturn, self.value = 0, 0, 0.0


class _MetricsGet:
    def __init__(self) -> None:
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [_Metric()]


class FakeGPM:
    """NVML's GPM calls: SM activity 75 % between any two samples; ``fail`` calls of nvmlGpmSampleGet raise first."""

    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_METRIC_SM_UTIL = 1, 2
    c_nvmlGpmMetricsGet_t = _MetricsGet

    def __init__(self, fail: int = 0) -> None:
        self.fail, self.freed = fail, 0

    def nvmlGpmSampleGet(self, handle, sample):
        if self.fail:
            self.fail -= 1
            raise RuntimeError("NVML_ERROR_UNKNOWN")

    def nvmlGpmMetricsGet(self, get):
        get.metrics[0].value = 75.0

    def nvmlGpmSampleFree(self, sample):
        self.freed += 1


def _gpm_sampler(fake: FakeGPM) -> NVMLSampler:
    sampler = NVMLSampler(0)
    sampler._nvml, sampler._gpm, sampler.sm_reason = fake, [object(), object()], ""
    return sampler


def test_sm_activity_between_gpm_samples_survives_a_transient_error():
    sampler = _gpm_sampler(FakeGPM(fail=1))
    readings = [sampler._poll_gpm(float(t)) for t in range(4)]
    assert readings == [None, None, 75.0, 75.0]  # the error, then a fresh pair
    assert list(sampler.sm_errors) == ["RuntimeError: NVML_ERROR_UNKNOWN"] and sampler.sm_reason == ""


def test_gpm_stops_after_ten_errors_in_a_row_and_says_why():
    fake = FakeGPM(fail=10)
    sampler = _gpm_sampler(fake)
    assert [sampler._poll_gpm(float(t)) for t in range(12)] == [None] * 12
    assert "failed 10 times in a row" in sampler.sm_reason and fake.freed == 2 and sampler.mean_sm_active() is None


class OneAtATimeGPM(FakeGPM):
    """Records whether two GPM calls ever ran at once (two samplers at once segfaulted NVML on the H200)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside, self.overlaps, self.calls = 0, 0, 0
        self._count = threading.Lock()

    def nvmlGpmSampleGet(self, handle, sample):
        with self._count:
            self.inside += 1
            self.overlaps += self.inside > 1
            self.calls += 1
        time.sleep(0.002)
        with self._count:
            self.inside -= 1


def test_two_samplers_never_call_gpm_at_once():
    fake = OneAtATimeGPM()
    samplers = [_gpm_sampler(fake) for _ in range(2)]  # the watchdog's and ThroughputMeter's, in one process
    threads = [threading.Thread(target=lambda s=s: [s._poll_gpm(float(t)) for t in range(25)]) for s in samplers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls == 50 and fake.overlaps == 0
