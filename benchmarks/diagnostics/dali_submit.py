"""Where the training thread's time goes when it hands a batch to DALI (issue 63): beside ResNet-18 on the H200,
``DaliWindows.submit`` took 19-24 ms of the training thread per batch of 256 (``gpu_decode.py``'s handover parts),
about one ResNet-18 step. Per variant of the pipeline, per batch: ``feed_input``'s and ``schedule_run``'s wall and
thread-CPU time, ``share_outputs``' wait, and, in a second pass with a counting thread beside, how much of
``schedule_run``'s wall time another Python thread could run (its count rate then over its rate while this thread
sleeps: near 0, the call holds the GIL). cProfile's top functions of the package's own ``submit``.

    cd benchmarks/diagnostics && python dali_submit.py --data /tmp/lgb-data --out /tmp/dali_submit.json
"""

from __future__ import annotations

import cProfile
import io
import pstats
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import demo_tree, parser_for, record_batches, write_probe

#: name -> (exec_dynamic, no_copy, decoder device, hw_decoder_load, the JPEGs as one array of rows)
VARIANTS = {"as_built": (True, True, "mixed", 1.0, False), "inputs_copied": (True, False, "mixed", 1.0, False),
            "classic_executor": (False, True, "mixed", 1.0, False), "hw_load_0": (True, True, "mixed", 0.0, False),
            "cpu_decoder": (True, True, "cpu", 1.0, False), "rows": (True, True, "mixed", 1.0, True)}  # fmt: skip


def build(batch: int, exec_dynamic: bool, no_copy: bool, device: str, hw: float, rows: bool) -> Any:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=8, device_id=0, prefetch_queue_depth=1, exec_dynamic=exec_dynamic,
                  exec_async=True, exec_pipelined=True)  # fmt: skip
    def windows() -> Any:
        jpegs = fn.external_source(name="jpegs", dtype=types.UINT8, no_copy=no_copy)
        if rows:  # one array, a JPEG per row, cut to its length by DALI (as the package feeds it)
            jpegs = fn.slice(jpegs, start=[0], shape=fn.external_source(name="lengths", dtype=types.INT32), axes=[0])
        anchor = fn.external_source(name="anchor", dtype=types.INT32)
        shape = fn.external_source(name="shape", dtype=types.INT32)
        extra = {"hw_decoder_load": hw} if device == "mixed" else {}
        images = fn.decoders.image_slice(jpegs, anchor, shape, axis_names="HW", output_type=types.RGB, device=device,
                                         adjust_orientation=False, **extra)  # fmt: skip
        return fn.pad(images, fill_value=0)

    pipe = windows()
    pipe.build()
    return pipe


def inputs(records: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    g = np.asarray(records.geometry)
    jpegs = [jpeg.numpy() for jpeg in records.jpegs()]
    w = np.ascontiguousarray(g[:, [0, 5, 1, 6]], dtype=np.int32)
    return jpegs, np.ascontiguousarray(w[:, :2]), np.ascontiguousarray(w[:, 2:])


def row_inputs(records: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    _, anchor, shape = inputs(records)
    lengths = np.asarray(records.lengths, dtype=np.int32).reshape(-1, 1)
    return (records.jpeg.numpy(), lengths), anchor, shape


def timed_pass(pipe: Any, feeds: list[tuple], rounds: int, counter: list[int] | None) -> dict[str, float]:
    sums = {k: 0.0 for k in ("feed_ms", "feed_cpu_ms", "schedule_ms", "schedule_cpu_ms", "outputs_ms")}
    counted = 0.0
    for k in range(rounds):
        jpegs, anchor, shape = feeds[k % len(feeds)]
        t0, c0 = time.perf_counter(), time.thread_time()
        if isinstance(jpegs, tuple):  # rows and their lengths
            pipe.feed_input("jpegs", jpegs[0])
            pipe.feed_input("lengths", jpegs[1])
        else:
            pipe.feed_input("jpegs", jpegs)
        pipe.feed_input("anchor", anchor)
        pipe.feed_input("shape", shape)
        t1, c1 = time.perf_counter(), time.thread_time()
        n0 = counter[0] if counter else 0
        pipe.schedule_run()
        t2, c2 = time.perf_counter(), time.thread_time()
        if counter:
            counted += counter[0] - n0
        pipe.share_outputs()
        pipe.release_outputs()
        t3 = time.perf_counter()
        for key, v in (("feed_ms", t1 - t0), ("feed_cpu_ms", c1 - c0), ("schedule_ms", t2 - t1),
                       ("schedule_cpu_ms", c2 - c1), ("outputs_ms", t3 - t2)):  # fmt: skip
            sums[key] += 1000 * v / rounds
    if counter:
        sums["counts_per_ms_in_schedule"] = counted / max(1e-9, sums["schedule_ms"] * rounds)
    return sums


def beside(batches: list[Any], bs: int) -> dict[str, Any]:
    """The package's ``DaliWindows`` (two pipelines) fed before each step of ResNet-18 training on resident
    batches (the default stream), the JPEGs in pageable or in pinned memory (the DataLoader pins them): the
    training thread's wall and CPU time per submit, split, and the model's rate."""
    import torch
    from _common import _shared

    from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliWindows

    train = _shared.resident_training("resnet18", bs)
    train(15)
    res: dict[str, Any] = {"model_alone_img_s": train(100)}
    for pinned in (False, True):
        use = [b.pin_memory() for b in batches] if pinned else batches
        feeds = [(b.jpeg.numpy(), np.asarray(b.lengths), np.asarray(b.geometry)) for b in use]
        dali = DaliWindows("cuda")
        tickets: list[int] = []
        cpu = [0.0]

        def before(k: int, dali=dali, feeds=feeds, tickets=tickets, cpu=cpu) -> None:
            c0 = time.thread_time()
            tickets.append(dali.submit(*feeds[k % len(feeds)]))
            cpu[0] += time.thread_time() - c0
            if len(tickets) > 2:
                dali.collect(tickets.pop(0))
            return None

        train(10, before)
        for key in dali.timings:
            dali.timings[key] = 0
        cpu[0] = 0.0
        rate = train(100, before)
        n = 100
        res["pinned" if pinned else "pageable"] = {
            "model_img_s": rate, "model_vs_alone": rate / res["model_alone_img_s"],
            "submit_cpu_ms": 1000 * cpu[0] / n,
            **{f"{k[:-2]}_ms": 1000 * v / n for k, v in dali.timings.items() if k.endswith("_s")}}
        while tickets:
            dali.collect(tickets.pop(0))
        dali.close()
        torch.cuda.synchronize()
        print("beside resnet18", res, flush=True)
    return res


def main() -> int:
    parser = parser_for(__doc__)
    parser.set_defaults(images=64000)
    parser.add_argument("--rounds", type=int, default=16)
    args = parser.parse_args()
    root = demo_tree(args)
    batches = record_batches(root, args.batch_size, 1024)
    feeds = [inputs(b) for b in batches]
    out: dict[str, Any] = {"batch_size": args.batch_size, "rounds": args.rounds}
    counter, stop = [0], threading.Event()

    def count() -> None:
        while not stop.is_set():
            counter[0] += 1

    for name, (dynamic, no_copy, device, hw, rows) in VARIANTS.items():
        try:
            pipe = build(args.batch_size, dynamic, no_copy, device, hw, rows)
            given = [row_inputs(b) for b in batches] if rows else feeds
            timed_pass(pipe, given, 3, None)
            res = timed_pass(pipe, given, args.rounds, None)
            thread = threading.Thread(target=count, daemon=True)
            stop.clear()
            thread.start()
            n0 = counter[0]
            time.sleep(0.5)
            idle_rate = (counter[0] - n0) / 500
            res["with_counting_thread"] = timed_pass(pipe, given, args.rounds, counter)
            stop.set()
            thread.join()
            res["counts_per_ms_while_sleeping"] = idle_rate
            res["gil_free_share_in_schedule"] = res["with_counting_thread"]["counts_per_ms_in_schedule"] / idle_rate
            del pipe
        except Exception as e:
            res = {"error": f"{type(e).__name__}: {e}"[:400]}
        out[name] = res
        print(name, res, flush=True)

    from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliWindows

    out["beside_resnet18"] = beside(batches, args.batch_size)
    dali = DaliWindows("cuda")
    rows = [(b.jpeg.numpy(), np.asarray(b.lengths), np.asarray(b.geometry)) for b in batches]
    dali.collect(dali.submit(*rows[0]))
    prof = cProfile.Profile()
    for k in range(args.rounds):
        prof.enable()
        ticket = dali.submit(*rows[k % len(rows)])
        prof.disable()
        dali.collect(ticket)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
    out["package_submit_cprofile"] = text.getvalue()[-4000:]
    out["package_timings"] = dali.timings
    write_probe(out, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
