"""Can the workers feed the GPU decode fast enough (issue 63)? Beside ResNet-18 on the H200 the training thread waited
for data 0.29-0.30 of its step with the GPU decoding every sample (ResNet-18's step needs 41 batches/s for 80 % of
its ceiling); the hand-over to DALI took it 1.5 ms a batch. This times the user's ``ImageFolder`` (Lightning's
ImageNet example's transforms) taken over at GPU share 1 through a DataLoader alone, as the one line builds it
(persistent workers, pinned where CUDA is, batch 256): batches/s over a window after the warm-up, and the receiving
threads' CPU per batch (the training process's, which shares the GIL with the training thread); per worker count.

    cd benchmarks/diagnostics && python records_loader.py --data /tmp/lgb-data --images 64000 --workers 16 8 --by-name
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import torch
from _common import demo_tree, parser_for, write_probe
from gpu_decode_variants import keep_off_cpus


def timed(root: Path, workers: int, batch: int, batches: int, name: bool = False) -> dict[str, float]:
    """The loader's batches/s and the training process's CPU per batch (after ``batches`` of warm-up)."""
    from torch.utils.data import DataLoader, RandomSampler

    from lightning_gpu_boost.baselines import plain_image_folder
    from lightning_gpu_boost.core.gpu_decode import Share, take_over

    dataset = plain_image_folder(root, 224)
    take_over(dataset, Share(1.0))
    sampler = RandomSampler(dataset, replacement=True, num_samples=batch * batches * 3)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers, persistent_workers=True,
                        pin_memory=torch.cuda.is_available(),  # --by-name: the handover variant's workers
                        worker_init_fn=functools.partial(keep_off_cpus, 0, 0, by_name=True) if name else None)  # fmt: skip
    it = iter(loader)
    for _ in range(batches):
        next(it)
    cpu, wall, main = time.process_time(), time.perf_counter(), time.thread_time()
    for _ in range(batches):
        next(it)
    wall = time.perf_counter() - wall
    # process_time counts this process only (the workers are others): the main and the pin-memory threads
    return {"workers": workers, "by_name": name, "batches_s": batches / wall, "process_cpu_ms_per_batch": (time.process_time() - cpu)
            / batches * 1e3, "main_thread_cpu_ms_per_batch": (time.thread_time() - main) / batches * 1e3}  # fmt: skip


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[16, 8])
    parser.add_argument("--batches", type=int, default=100, help="timed batches (and as many of warm-up)")
    parser.add_argument("--by-name", action="store_true", help="each worker count again, its batches by name")
    parser.set_defaults(out="/tmp/records_loader.json")
    args = parser.parse_args()
    root = demo_tree(args)
    cases = [timed(root, w, args.batch_size, args.batches, name) for w in args.workers
             for name in ((False, True) if args.by_name else (False,))]  # fmt: skip
    write_probe({"cuda": torch.cuda.is_available(), "cases": cases}, Path(args.out))


if __name__ == "__main__":
    main()
