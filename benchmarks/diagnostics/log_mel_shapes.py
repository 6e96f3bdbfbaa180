"""Diagnosis: what a new batch shape costs ``LogMel`` on the GPU. Batches of 32 int16 clips padded to their longest
clip (3-8 s at 16 kHz, as the ``audio`` workload's best sends them), each batch's longest length new or repeated:

- ``new_lengths_pad_1``: every batch a new length, no padding (one STFT input shape per batch);
- ``new_lengths_pad_64``: every batch a new length, ``pad_to=64`` (one STFT input length per frame count);
- ``same_length``: one length for every batch (the shapes of a resident batch).

Each case: milliseconds per batch, host (the call returns) and with the GPU finished (``synchronize`` per batch).

    python benchmarks/diagnostics/log_mel_shapes.py --batches 200
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _common import RESULTS

from lightning_gpu_boost.core.gpu_transforms import LogMel
from lightning_gpu_boost.core.results import write_result

CASES = ("new_lengths_pad_1", "new_lengths_pad_64", "same_length")


def lengths_for(case: str, batches: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    if case == "same_length":
        return [128_000] * batches
    # distinct longest lengths, never seen before in this process (the seed moves them)
    return (48_000 + torch.randperm(80_000, generator=g)[:batches]).tolist()


def time_case(case: str, batches: int, seed: int) -> dict[str, float]:
    mel = LogMel(source_rate=16_000, rate=16_000, pad_to=1 if case == "new_lengths_pad_1" else 64)
    device = torch.device("cuda")
    pool = torch.randint(-3000, 3000, (32, 128_000), dtype=torch.int16, device=device)
    lengths = torch.full((32,), 48_000, device=device)
    mel((pool[:, :1000], lengths, None))  # constants and kernels ready
    torch.cuda.synchronize()
    host = synced = 0.0
    for n in lengths_for(case, batches, seed):
        started = time.perf_counter()
        mel((pool[:, :n], lengths, None))
        host += time.perf_counter() - started
        torch.cuda.synchronize()
        synced += time.perf_counter() - started
    return {"host_ms_per_batch": 1e3 * host / batches, "ms_per_batch": 1e3 * synced / batches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--out", default=RESULTS, help="the results folder (default: benchmarks/results)")
    args = parser.parse_args()
    figures = {"config": vars(args)}
    for seed, case in enumerate(CASES):
        figures[case] = time_case(case, args.batches, seed)
        print(case, figures[case], flush=True)
    print(f"wrote {write_result('log_mel_shapes', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
