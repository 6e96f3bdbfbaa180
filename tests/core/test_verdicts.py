"""The verdict taxonomy shared by the watchdog and doctor: the right verdict, and advice that fits the run."""

from __future__ import annotations

import pytest

from lightning_gpu_boost.core.verdicts import (
    Evidence,
    RunFacts,
    advise,
    classify,
    sample_cost_fixes,
    span_bound,
)
from lightning_gpu_boost.core.workers import WorkerProbe


@pytest.mark.parametrize(
    "evidence,verdict",
    [
        (Evidence(0.6, 10.0, 15.0, gpu_util=30.0), "data-bound"),
        (Evidence(0.6, 10.0, 15.0), "data-bound"),  # no NVML: the wait alone decides
        (Evidence(0.6, 10.0, 15.0, gpu_util=30.0, copy_ms=12.0), "copy-bound"),
        (Evidence(0.05, 40.0, 2.0, gpu_util=45.0, gpu_mem_frac=0.6), "host-bound"),  # .item() + Python in the step
        (Evidence(0.05, 40.0, 2.0, gpu_util=45.0, gpu_mem_frac=0.1), "host-bound"),  # not "small": the GPU idles
        (Evidence(0.02, 3.0, 0.1, gpu_util=97.0, gpu_mem_frac=0.05), "small"),
        # tokens_lm and ResNet-50 on the H100 (82 and 64 ms steps at 100 %, 26 and 17 % of its memory): the ceiling
        (Evidence(0.0, 82.4, 0.0, gpu_util=100.0, gpu_mem_frac=0.26), "ok"),
        (Evidence(0.01, 64.5, 0.6, gpu_util=99.0, gpu_mem_frac=0.17), "ok"),
        (Evidence(0.02, 60.0, 1.0, gpu_util=99.0, gpu_mem_frac=0.7), "ok"),
        (Evidence(0.02, 60.0, 1.0), "ok"),  # CPU run, fed
    ],
)
def test_classify(evidence, verdict):
    assert classify(evidence) == verdict


def test_time_outside_the_steps_is_its_own_verdict_at_the_end_of_a_run():
    e = Evidence(0.02, 60.0, 1.0, gpu_util=99.0, gpu_mem_frac=0.7, between_frac=0.6, validation_frac=0.3)
    assert classify(e) == "ok" and classify(e, include_between=True) == "between-steps"
    facts = RunFacts(cuda=True, num_workers=16, usable_cpus=16, persistent_workers=False, val_loaders=[(4, False)],
                     batches_per_epoch=31)  # fmt: skip
    text = " ".join(advise("between-steps", facts, e))
    assert "persistent_workers=True" in text and "validation" in text and "31 batches" in text
    persistent = RunFacts(cuda=True, num_workers=16, usable_cpus=16, persistent_workers=True, batches_per_epoch=250)
    assert "persistent_workers=True keeps" not in " ".join(advise("between-steps", persistent, e))


def test_spanning_epochs_is_bounded_by_the_time_outside_the_steps():
    assert span_bound(Evidence(0.02, 60.0, 1.0, between_frac=0.66)) == pytest.approx(1 / 0.34)
    assert span_bound(Evidence(0.02, 60.0, 1.0)) is None
    facts = RunFacts(cuda=True, num_workers=2, usable_cpus=16, persistent_workers=False, batches_per_epoch=32)
    assert "expect up to 2.94x" in " ".join(advise("between-steps", facts, Evidence(0.02, 60.0, 1.0, between_frac=0.66)))


def test_advice_never_names_what_is_already_on():
    e = Evidence(0.6, 10.0, 15.0, gpu_util=30.0)
    plain = " ".join(advise("data-bound", RunFacts(cuda=True, num_workers=0, usable_cpus=16, pin_memory=False,
                                                   persistent_workers=False)))  # fmt: skip
    assert "add AutoNumWorkers()" in plain and "pin_memory=True" in plain and "StreamPrefetch()" in plain
    boosted = RunFacts(cuda=True, num_workers=16, usable_cpus=16, pin_memory=True, persistent_workers=True,
                       prefetch=True, tuner=True, uint8_images=True)  # fmt: skip
    text = " ".join(advise("data-bound", boosted, e))
    for already_on in ("add AutoNumWorkers()", "StreamPrefetch()", "pin_memory=True", "persistent_workers=True",
                       "ship uint8 images"):  # fmt: skip
        assert already_on not in text, (already_on, text)
    assert "set by the worker tuner" in text
    probe = WorkerProbe(16, {8: 10.0, 16: 12.0}, 5.0, 16, user_workers=4)
    measured = " ".join(advise("data-bound", RunFacts(cuda=True, num_workers=16, usable_cpus=16, tuner=True,
                                                      probe=probe)))  # fmt: skip
    assert "was measured as the fastest count" in measured and "add AutoNumWorkers()" not in measured


def test_a_jpeg_bound_run_is_told_to_decode_on_the_gpu_unless_our_part_placed_it():
    """Issue 63, one voice: a torchvision pipeline the GPU decode would take is told to decode on the GPU; where the
    GPU decode took it (on the GPU, or kept on the CPU by measurement), no advice undoes or repeats the placement."""
    e = Evidence(0.6, 10.0, 15.0, gpu_util=30.0)
    probe = WorkerProbe(16, {8: 10.0, 16: 12.0}, 5.0, 16, user_workers=4)
    base = dict(cuda=True, num_workers=16, usable_cpus=16, pin_memory=True, persistent_workers=True, prefetch=True,
                tuner=True, probe=probe, batch_kind="images")  # fmt: skip
    told = " ".join(advise("data-bound", RunFacts(**base, decode_takes=True), e))
    assert 'decode the JPEGs on the GPU: GPUBoost() (its decode="auto"' in told
    for placed in ("gpu", "cpu", "gpu 48 %"):
        text = " ".join(advise("data-bound", RunFacts(**base, decode_takes=True, decode=placed), e))
        assert "decode the JPEGs on the GPU" not in text and "DALI" not in text and "ship uint8" not in text, text
    assert "decode the JPEGs on the GPU" not in " ".join(advise("data-bound", RunFacts(**base), e))


def test_a_host_bound_step_gets_no_data_advice():
    facts = RunFacts(cuda=True, num_workers=0, usable_cpus=16, pin_memory=False)
    text = " ".join(advise("host-bound", facts, Evidence(0.05, 40.0, 2.0, gpu_util=45.0)))
    assert ".item()" in text and "torch.compile" in text
    assert "num_workers" not in text and "AutoNumWorkers" not in text and "pin_memory" not in text


def test_cheap_rows_at_a_large_batch_are_told_to_fetch_whole_batches():
    probe = WorkerProbe(16, {8: 50.0, 16: 80.0}, 5.0, 16, user_workers=0, sample_ms=0.004)
    text = " ".join(advise("data-bound", RunFacts(num_workers=16, usable_cpus=16, batch_size=8192, tuner=True,
                                                  probe=probe)))  # fmt: skip
    assert "__getitems__" in text


def test_batch_kind_and_the_sample_cost_advice_follow_what_the_batches_hold():
    import torch

    from lightning_gpu_boost.core.verdicts import batch_kind

    images, masks = torch.rand(4, 3, 32, 32), torch.zeros(4, 32, 32, dtype=torch.long)
    assert batch_kind((images, torch.arange(4))) == "images"
    assert batch_kind({"image": images, "mask": masks}) == "images+masks"
    assert batch_kind((torch.rand(4, 300, 80), torch.tensor([300, 200, 100, 50]), torch.arange(4))) == "features"
    assert batch_kind((torch.randint(0, 9, (4, 64)), torch.randint(0, 9, (4, 64)))) == "tokens"
    assert batch_kind((torch.rand(4, 64), torch.arange(4))) == "rows"
    assert batch_kind("text") is None
    e = Evidence(0.6, 10.0, 15.0, gpu_util=30.0)

    def advice(kind: str, workers: int = 16) -> str:
        return " ".join(advise("data-bound", RunFacts(cuda=True, num_workers=workers, usable_cpus=16, tuner=True,
                                                      batch_kind=kind, prefetch=True), e))  # fmt: skip

    assert "spectrogram" in advice("features") and "uint8 images" not in advice("features")
    assert "kornia" in advice("images+masks")
    assert "memmap" in advice("tokens") and "DALI" not in advice("tokens")
    assert "DALI" in advice("images") and "uint8" in advice("images")
    rows = " ".join(advise("data-bound", RunFacts(num_workers=0, usable_cpus=16, batch_kind="rows"), e))
    assert rows.index("__getitems__") < rows.index("AutoNumWorkers"), rows


def test_host_bound_with_every_cpu_in_workers_names_the_crowding_first():
    e = Evidence(0.02, 38.9, 0.8, gpu_util=12.0, gpu_mem_frac=0.1)
    crowded = advise("host-bound", RunFacts(cuda=True, num_workers=16, usable_cpus=16), e)
    assert "num_workers=15" in crowded[0] and "StreamPrefetch(transform" in crowded[0]
    spare = advise("host-bound", RunFacts(cuda=True, num_workers=8, usable_cpus=16), e)
    assert "num_workers" not in spare[0] and ".item()" in spare[0]


def test_rows_fetched_whole_get_no_advice_to_fetch_them_whole():
    from torch.utils.data import DataLoader, Dataset

    from lightning_gpu_boost.core.verdicts import fetches_batches

    class Batched(Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return i

        def __getitems__(self, indices):
            return indices

    assert fetches_batches(DataLoader(Batched(), batch_size=4)) and not fetches_batches(DataLoader(range(8)))
    assert fetches_batches(DataLoader(range(8), batch_size=None))
    plain = sample_cost_fixes(RunFacts(cuda=True, batch_size=8192, batch_kind="rows"))
    whole = sample_cost_fixes(RunFacts(cuda=True, batch_size=8192, batch_kind="rows", batched_fetch=True))
    assert "__getitems__(indices)" in plain[0] and "__getitems__" not in " ".join(whole)
    assert "gathered" in whole[0]


def test_a_stream_waiting_on_downloads_is_told_the_download_side_fixes_and_never_autonumworkers():
    from lightning_gpu_boost.core.verdicts import RunFacts, advise

    stream = {"url": "s3://bucket/train", "max_pre_download": 2}
    advice = advise("data-bound", RunFacts(num_workers=1, usable_cpus=16, remote_stream=stream, uint8_images=True,
                                           batch_kind="images", persistent_workers=True))  # fmt: skip
    assert "downloaded from s3://bucket/train" in advice[0] and "max_pre_download=4), 2 now" in advice[0]
    assert "cache_dir on a local NVMe disk" in advice[0]
    assert "set num_workers to about 15" in advice[1] and "AutoNumWorkers leaves it alone" in advice[1]
    assert not any("add AutoNumWorkers()" in a for a in advice)
    tuned = advise("data-bound", RunFacts(num_workers=15, usable_cpus=16, remote_stream=stream, tuner=True,
                                          batch_kind="images", uint8_images=True))  # fmt: skip
    assert not any("set by the worker tuner" in a for a in tuned)  # GPUBoost's tuner never touched the stream


def test_a_wait_on_idle_workers_while_the_cache_grows_is_remote_io_bound():
    """Workers idle (their CPU time) while a stream's cache grows: the wait is on downloads; busy workers, or no
    growth (a warm cache), keep the CPU-side verdict."""
    link = Evidence(0.6, 10.0, 15.0, workers_busy=0.1, download_bytes_s=5e6)
    assert classify(link) == "remote-io-bound"
    assert classify(Evidence(0.6, 10.0, 15.0, workers_busy=0.95, download_bytes_s=5e6)) == "data-bound"  # decoding
    assert classify(Evidence(0.6, 10.0, 15.0, workers_busy=0.1, download_bytes_s=0.0)) == "data-bound"  # warm cache
    assert classify(Evidence(0.6, 10.0, 15.0, download_bytes_s=5e6)) == "data-bound"  # workers not measured
    assert classify(Evidence(0.05, 10.0, 0.5, workers_busy=0.1, download_bytes_s=5e6)) == "ok"  # fed: no warning
    stream = {"url": "s3://b/p", "max_pre_download": 2, "cache_dir": "/tmp/c"}
    advice = advise("remote-io-bound", RunFacts(num_workers=1, usable_cpus=8, remote_stream=stream), link)
    assert "downloads from s3://b/p" in advice[0] and "max_pre_download=4" in advice[0] and "10 %" in advice[0]
    assert "set it to about 7" in advice[1] and any("chunk_bytes" in a for a in advice)
    chosen = RunFacts(num_workers=1, usable_cpus=8, remote_stream=stream, chosen_by={"num_workers": "AutoNumWorkers"})
    assert not any("num_workers" in a for a in advise("remote-io-bound", chosen, link))
    busy = Evidence(0.6, 10.0, 15.0, workers_busy=0.95, download_bytes_s=5e6)
    decoding = advise("data-bound", RunFacts(num_workers=7, usable_cpus=8, remote_stream=stream), busy)
    assert "downloaded from" not in decoding[0]  # busy workers: the CPU side's fixes lead
