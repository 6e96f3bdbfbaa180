"""Diagnosis: the host time per batch of the stream prefetcher's parts, where a step is short (tabular: 3.5 ms)
or launch-bound (audio), measured without a model so that only the data path's own cost shows.

- ``table``: batches of 8,192 indices into a 2 M x 64 table held on the GPU (the tabular workload's best): the
  indices copied and the rows gathered in this thread (``direct``), through ``StreamPrefetcher`` with the gather
  in this thread (``prefetch``), and as the prefetcher's transform (``prefetch_transform``); plus the cost of the
  per-batch ``fork_rng`` and seeding around a transform alone (``fork_rng``).
- ``logmel``: ``LogMel`` on padded int16 waveforms of 32 clips of 3-8 s at 44.1 kHz (the audio workload's best),
  batches all of one length (``fixed``) and of the lengths a shuffled epoch gives (``varying``: new FFT sizes for
  cuFFT's plan cache), host time per call and GPU time per call.

    cd benchmarks/diagnostics && python prefetch_overhead.py
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import RESULTS

from lightning_gpu_boost.core.gpu_transforms import LogMel
from lightning_gpu_boost.core.prefetch import StreamPrefetcher
from lightning_gpu_boost.core.results import write_result


def per_batch_us(fn, n: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn(n)
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / n * 1e6


def table(n: int, rows: int = 2_000_000, batch: int = 8192) -> dict:
    dev = torch.device("cuda", torch.cuda.current_device())
    x, y = torch.randn(rows, 64, device=dev), torch.randint(0, 2, (rows,), device=dev)
    idx = [t.pin_memory() for t in torch.randperm(rows)[: n * batch].split(batch)]

    def gather(i: torch.Tensor):
        return x[i], y[i]

    def direct(k: int) -> None:
        for i in idx[:k]:
            gather(i.to(dev, non_blocking=True))

    def prefetch(k: int) -> None:
        for i in StreamPrefetcher(idx[:k], device=dev):
            gather(i)

    def prefetch_transform(k: int) -> None:
        for _ in StreamPrefetcher(idx[:k], device=dev, transform=gather):
            pass

    def fork_rng(k: int) -> None:
        for _ in range(k):
            with torch.random.fork_rng(devices=[dev], device_type="cuda"):
                torch.random.default_generator.manual_seed(1)
                torch.cuda.default_generators[dev.index].manual_seed(1)

    out = {}
    for name, fn in (("direct", direct), ("prefetch", prefetch), ("prefetch_transform", prefetch_transform),
                     ("fork_rng", fork_rng)):  # fmt: skip
        fn(min(n, 20))  # warm-up
        out[name] = min(per_batch_us(fn, n) for _ in range(3))
    return out


def logmel(n: int) -> dict:
    dev = torch.device("cuda", torch.cuda.current_device())
    mel = LogMel(source_rate=44_100, rate=16_000, n_fft=400, hop=160, n_mels=80)
    g = torch.Generator().manual_seed(0)
    lengths = [(torch.rand(32, generator=g) * 5 + 3) * 44_100 for _ in range(n)]
    lengths = [lens.long() for lens in lengths]
    longest = max(int(lens.max()) for lens in lengths)
    waves = torch.randint(-3000, 3000, (32, longest), dtype=torch.int16).pin_memory().to(dev)
    fixed = [(waves, torch.full((32,), longest, dtype=torch.long, device=dev)) for _ in range(n)]
    varying = [(waves[:, : int(lens.max())], lens.to(dev)) for lens in lengths]
    out = {}
    for name, batches in (("fixed", fixed), ("varying", varying), ("varying_again", varying)):
        torch.cuda.synchronize()
        start, begin = time.perf_counter(), torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        for b in batches:
            mel(b)
        end.record()
        host = time.perf_counter() - start
        torch.cuda.synchronize()
        out[name] = {"host_us": host / n * 1e6, "gpu_us": begin.elapsed_time(end) / n * 1e3}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--out", default=RESULTS, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    figures = {"config": vars(args), "table_us_per_batch": table(args.batches), "logmel": logmel(args.batches)}
    print(figures)
    print(f"wrote {write_result('prefetch_overhead', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
