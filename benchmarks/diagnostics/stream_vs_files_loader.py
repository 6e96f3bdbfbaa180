"""Diagnosis: do a warm litdata stream and the same images as local files cost the loader the same? The two loaders
alone (no model), ``StreamingDataModule`` over a stream written from the demo tree (a local folder: what a warm
cache reads) and ``ImageFolderDataModule`` over the tree itself, the same decode (``core/images.py``'s
reduced-size random-resized crop to uint8), the same workers and batch size, timed in alternating pairs (files,
stream, files, stream, ...) after each loader's first batches (its workers' start-up). The figure is each pair's
ratio (stream / files) and their median; no bar.

It explains ``benchmarks/streaming.py``'s ``warm_epoch_of_local``: where the loaders alone agree, a warm epoch
measured minutes away from the local files' differs by the host, not by the stream.

    cd benchmarks/diagnostics && python stream_vs_files_loader.py --data /tmp/bench-data --images 3000
"""

from __future__ import annotations

import statistics
import time

from _common import RESULTS, demo_tree, parser_for

from lightning_gpu_boost.core.cpus import usable_cpus
from lightning_gpu_boost.core.results import write_result
from lightning_gpu_boost.core.streaming import write_image_stream
from lightning_gpu_boost.datamodules import ImageFolderDataModule, StreamingDataModule

SKIP = 4  # batches left out of each timing: the workers' start-up and first batches


def loader_rate(datamodule) -> float:
    """Images per second of ``datamodule``'s training loader over one epoch, its first ``SKIP`` batches left out."""
    datamodule.setup("fit")
    n, start = 0, None
    for i, (_, labels) in enumerate(datamodule.train_dataloader()):
        if i == SKIP:
            n, start = 0, time.perf_counter()
        n += len(labels)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--pairs", type=int, default=3, help="alternating pairs (files, stream)")
    parser.add_argument("--workers", type=int, default=None, help="loader workers (default: every usable CPU)")
    parser.set_defaults(images=3000, batch_size=64, out=RESULTS)
    args = parser.parse_args()
    tree = demo_tree(args)
    stream = f"{args.data}/stream-{args.images}"
    written = write_image_stream(tree, stream, chunk_bytes="16MB")
    workers = args.workers or usable_cpus()
    pairs = []
    for k in range(args.pairs):
        pair = {}
        for which in ("files", "stream") if k % 2 == 0 else ("stream", "files"):
            data = (ImageFolderDataModule(str(tree), batch_size=args.batch_size, num_workers=workers)
                    if which == "files" else
                    StreamingDataModule(stream, batch_size=args.batch_size, num_workers=workers,
                                        cache_dir=f"{args.data}/stream-cache"))  # fmt: skip
            pair[which] = loader_rate(data)
        pair["ratio"] = pair["stream"] / pair["files"]
        pairs.append(pair)
        print(f"pair {k}: {pair}", flush=True)
    figures = {"config": vars(args), "samples": written["samples"], "workers": workers, "pairs": pairs,
               "ratio_median": statistics.median(p["ratio"] for p in pairs)}  # fmt: skip
    print(f"wrote {write_result('stream_vs_files_loader', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
