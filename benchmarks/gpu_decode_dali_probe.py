"""Probe (issue 63): the JPEG windows decoded by a DALI pipeline (its own C++ threads, no GIL) fed from the training
loop's thread, beside ResNet-18 training.

    python benchmarks/gpu_decode_dali_probe.py --images 8000 --out /tmp/dali
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import demo_tree, parser_for, resident_training, write_probe
from gpu_decode_probe import setup


def main() -> int:
    parser = parser_for(__doc__)
    parser.set_defaults(images=8000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--hw-load", type=float, default=0.9)
    args = parser.parse_args()
    root = demo_tree(args)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    bs = args.batch_size
    batches, geos, finish, variants, result = setup(root, bs)
    from nvidia import dali
    from nvidia.dali import fn, types
    from nvidia.dali.plugin.pytorch import feed_ndarray

    result["dali"] = dali.__version__

    @dali.pipeline_def(batch_size=bs, num_threads=args.threads, device_id=torch.cuda.current_device(),
                       prefetch_queue_depth=1, exec_dynamic=True)  # fmt: skip
    def windows_pipe() -> Any:
        jpegs = fn.external_source(name="jpegs", dtype=types.UINT8)
        anchor = fn.external_source(name="anchor", dtype=types.INT32)
        shape = fn.external_source(name="shape", dtype=types.INT32)
        images = fn.decoders.image_slice(jpegs, anchor, shape, axis_names="HW", device="mixed",
                                         output_type=types.RGB, hw_decoder_load=args.hw_load)  # fmt: skip
        return fn.pad(images, fill_value=0)

    pipe = windows_pipe()
    pipe.build()
    side = torch.cuda.Stream()

    def feed(k: int) -> None:
        b, g = batches[k], geos[k].numpy()
        pipe.feed_input("jpegs", [jpeg.numpy() for jpeg in b.jpegs()])
        pipe.feed_input("anchor", np.ascontiguousarray(g[:, [0, 5]], dtype=np.int32))
        pipe.feed_input("shape", np.ascontiguousarray(g[:, [1, 6]], dtype=np.int32))
        pipe.schedule_run()

    def take(k: int) -> torch.Tensor:
        (out,) = pipe.share_outputs()
        dense = out.as_tensor()
        windows = torch.empty(dense.shape(), dtype=torch.uint8, device="cuda")
        with torch.cuda.stream(side):
            feed_ndarray(dense, windows, cuda_stream=side.cuda_stream)
            side.synchronize()
        pipe.release_outputs()
        tall, wide = windows.shape[1], windows.shape[2]
        return finish(windows, geos[k], tall, wide)

    n_b = len(batches)
    feed(0)
    got = take(0)
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        ref = variants["memcpy"](0)
    torch.cuda.synchronize()
    diff = (got.float() - ref.float()).abs()
    result["dali_vs_engines"] = {"mean": diff.mean().item(), "max": diff.max().item()}
    # alone: feed k+1, take k
    feed(0)
    torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.thread_time()
    steps = 3 * n_b
    for k in range(steps):
        take(k % n_b)
        feed((k + 1) % n_b)
    torch.cuda.synchronize()
    result["dali_alone"] = {"img_s": steps * bs / (time.perf_counter() - t0),
                            "thread_cpu_ms_per_batch": 1000 * (time.thread_time() - c0) / steps}  # fmt: skip
    take(steps % n_b)
    print(json.dumps(result), flush=True)

    resident = resident_training("resnet18", bs)

    def next_batch(k: int) -> torch.Tensor:  # take batch k, hand over batch k + 1
        images = take(k % n_b)
        feed((k + 1) % n_b)
        return images

    def train(steps: int, fed: bool) -> float:
        if not fed:
            return resident(steps)
        feed(0)
        rate = resident(steps, next_batch)
        take(steps % n_b)
        return rate

    train(15, False)
    alone = train(200, False)
    train(10, True)
    fed = train(300, True)
    result["model_alone_img_s"] = alone
    result["model_fed_by_dali_img_s"] = fed
    result["fed_vs_alone"] = fed / alone
    result["model_alone_again_img_s"] = train(200, False)
    write_probe(result, out_dir / "dali.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
