"""Probe (issue 63): what DALI's decode alone costs a ResNet-18 step beside it, without the package in the way.

    python benchmarks/gpu_decode_interference.py --out /tmp/interference           # on the GPU machine
    python benchmarks/gpu_decode_interference.py --convert probe.json --out benchmarks/results

A ResNet-18 (bf16, channels_last, batch 256, SGD) trains on one resident batch in the main thread; a second thread
runs a DALI pipeline on 256 JPEGs of the bench's kind (crop window decoded, resized to 224, as the package's
``DaliWindows``), paced at ``--pace-ms`` a batch. Per configuration (the decoder's output type, the crop window or the
whole image, the JPEG engines or nvJPEG's CUDA decoder): the kernels and copies the decode launches per batch
(torch's profiler), the decode's batches/s alone and beside the step, and the step's GPU time (CUDA events) alone
and beside it. ``--no-sync``: the training thread does not wait for each step's loss, so that a delay of the thread
(the GIL, the CPUs) cannot show as GPU time: what remains is the GPU's own interference. ``--warm-beside NAME``:
the model's first steps, where cuDNN's benchmark picks the step's algorithms, run beside that decode (in
``decode="auto"`` they run beside the CPU decode, the GPU quiet; with ``decode="gpu"`` beside DALI's).
``--train-priority N``: the step on a stream of priority N, DALI's streams at the default. ``--decode-process``:
each decode again in a spawned process of its own (its own CUDA context, driver locks and GIL) beside the same step. Beside each decode the
profiler also sums the step's own kernels a step: grown, they shared the multiprocessors; not grown while the span
grew, the GPU waited between them.

No bars: a probe. ``--convert`` writes a raw probe file (``--out`` of a run on the lent machine, where only the
JSON comes back) as the result file, with the environment the raw file recorded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout, for `python benchmarks/...`

#: (name, output type, crop window, share for the JPEG engines)
CONFIGS = (("rgb_roi_engines", "rgb", True, 1.0), ("ycbcr_roi_engines", "ycbcr", True, 1.0),
           ("any_roi_engines", "any", True, 1.0), ("rgb_full_engines", "rgb", False, 1.0),
           ("ycbcr_full_engines", "ycbcr", False, 1.0), ("rgb_roi_cuda", "rgb", True, 0.0),
           # controls: the same feeds of the same bytes, no nvJPEG: copied to the GPU only; decoded by DALI's CPU
           # threads and the images copied to the GPU
           ("copy_only", "rgb", False, -1.0), ("cpu_decode", "rgb", True, -1.0))  # fmt: skip


def _jpegs(n: int) -> list[Any]:
    import numpy as np

    from lightning_gpu_boost.core.images import make_jpeg_folder

    root = Path("/tmp/probe-jpegs")
    if not (root / ".complete.json").exists():
        make_jpeg_folder(str(root), n=2 * n, num_classes=1, progress=False)
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))[:n]
    return [np.frombuffer(p.read_bytes(), dtype=np.uint8) for p in files]


def _pipeline(jpegs: list[Any], out_type: str, roi: bool, load: float, gpu: bool) -> Any:
    from nvidia.dali import fn, pipeline_def, types

    kinds = {"rgb": types.RGB, "ycbcr": types.YCbCr, "any": types.ANY_DATA}

    @pipeline_def(batch_size=len(jpegs), num_threads=8, device_id=0 if gpu else None, prefetch_queue_depth=1)
    def graph() -> Any:
        j = fn.external_source(name="j", dtype=types.UINT8, ndim=1)
        if load < 0:  # a control
            if not roi:
                return j.gpu() if gpu else j
            x = fn.decoders.image_slice(j, [0.1, 0.15], [0.6, 0.7], axis_names="HW", output_type=types.RGB)
            x = fn.resize(x, size=[224, 224], antialias=True, interp_type=types.INTERP_LINEAR)
            return x.gpu() if gpu else x
        extra = {"hw_decoder_load": load} if gpu else {}
        kind = "mixed" if gpu else "cpu"
        if roi:
            x = fn.decoders.image_slice(j, [0.1, 0.15], [0.6, 0.7], axis_names="HW", output_type=kinds[out_type],
                                        device=kind, **extra)  # fmt: skip
        else:
            x = fn.decoders.image(j, output_type=kinds[out_type], device=kind, **extra)
        return fn.resize(x, size=[224, 224], antialias=True, interp_type=types.INTERP_LINEAR)

    pipe = graph()
    pipe.build()
    return pipe


def _once(pipe: Any, jpegs: list[Any], spent: dict[str, float] | None = None) -> str:
    t0 = time.perf_counter()
    pipe.feed_input("j", jpegs)
    t1 = time.perf_counter()
    pipe.schedule_run()
    t2 = time.perf_counter()
    (out,) = pipe.share_outputs()
    t3 = time.perf_counter()
    shape = str(out.as_tensor().shape()) if out.is_dense_tensor() else f"{len(out)} samples"
    pipe.release_outputs()
    if spent is not None:
        for k, v in (("feed", t1 - t0), ("schedule", t2 - t1), ("share", t3 - t2), ("release", time.perf_counter() - t3)):
            spent[k] = spent.get(k, 0.0) + v
    return shape


def _kernels(pipe: Any, jpegs: list[Any], iters: int = 5) -> dict[str, Any]:
    """The kernels and copies one batch launches on the GPU: name, launches and ms a batch (the top 12)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            _once(pipe, jpegs)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        device_us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if device_us and e.count and not e.key.lower().startswith("cuda"):
            rows.append((e.key[:70], e.count / iters, device_us / iters / 1000))
    rows.sort(key=lambda r: -r[2])
    kernels = [r for r in rows if not r[0].startswith("Memcpy")]
    return {"top": rows[:12], "launches_per_batch": sum(r[1] for r in kernels),
            "kernel_ms_per_batch": sum(r[2] for r in kernels)}  # fmt: skip


class _Model:
    """ResNet-18 training on one resident batch; :meth:`steps` times its steps' GPU time."""

    def __init__(self, gpu: bool, sync: bool, priority: int | None = None) -> None:
        import torch

        self.gpu, self.sync = gpu, sync
        # --train-priority: the step on a stream of that priority (lower is higher), DALI's streams at the default
        self.stream = torch.cuda.Stream(priority=priority) if gpu and priority is not None else None
        if gpu:
            import torchvision

            self.model = torchvision.models.resnet18(num_classes=100).cuda().to(memory_format=torch.channels_last)
            self.x = torch.randn(256, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
            self.y = torch.randint(0, 100, (256,), device="cuda")
        else:  # a smoke run on a CPU
            self.model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AdaptiveAvgPool2d(1),
                                             torch.nn.Flatten(), torch.nn.Linear(8, 100))  # fmt: skip
            self.x, self.y = torch.randn(8, 3, 32, 32), torch.randint(0, 100, (8,))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        torch.backends.cudnn.benchmark = True

    def _step(self) -> Any:
        import torch

        with torch.autocast("cuda" if self.gpu else "cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss

    def steps(self, n: int = 60) -> dict[str, float]:
        import torch

        with torch.cuda.stream(self.stream):  # None: the current stream, as it is
            return self._steps(n)

    def _steps(self, n: int) -> dict[str, float]:
        import torch

        for _ in range(5):
            self._step()
        if not self.gpu:
            t0 = time.perf_counter()
            for _ in range(n):
                self._step()
            return {"step_ms_median": 1000 * (time.perf_counter() - t0) / n}
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for start, end in events:
            start.record()
            loss = self._step()
            end.record()
            if self.sync:
                loss.item()  # as a Lightning loop's progress does once a step
        torch.cuda.synchronize()
        ms = [a.elapsed_time(b) for a, b in events]
        return {"step_ms_median": statistics.median(ms), "step_ms_mean": statistics.fmean(ms),
                "wall_ms_per_step": 1000 * (time.perf_counter() - t0) / n}  # fmt: skip

    def launch_ms(self, n: int = 15) -> dict[str, float]:
        """The training thread's time to launch one step while the GPU is held busy (``torch.cuda._sleep``), so
        that no launch waits for room in the queue: where it nears the step's GPU time, the thread, not the GPU,
        sets the pace."""
        import torch

        ms = []
        with torch.cuda.stream(self.stream):  # None: the current stream, as it is
            for _ in range(n):
                torch.cuda.synchronize()
                torch.cuda._sleep(100_000_000)  # ~50 ms at ~2 GHz
                t0 = time.perf_counter()
                self._step()
                ms.append(1000 * (time.perf_counter() - t0))
            torch.cuda.synchronize()
        return {"launch_ms_median": statistics.median(ms), "launch_ms_max": max(ms)}

    def kernel_ms(self, n: int = 10) -> dict[str, float]:
        """The step's own kernels' GPU time a step (DALI's and nvJPEG's kernels and the copies left out), by the
        profiler: where it grows beside a decode, the step's kernels ran slower (they shared the multiprocessors);
        where only the step's span grows, the GPU waited between them."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        with torch.cuda.stream(self.stream):  # None: the current stream, as it is
            self._step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(n):
                    self._step()
                torch.cuda.synchronize()
        total = launches = 0.0
        for e in prof.key_averages():
            name = e.key.lower()
            device_us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if device_us and e.count and not any(k in name for k in ("nvjpeg", "dali", "memcpy", "memset")):
                total, launches = total + device_us, launches + e.count
        return {"step_kernel_ms": total / n / 1000, "step_launches": launches / n}


def _child(config: str, pace_s: float, stop: Any, done: Any, ready: Any) -> None:
    """``--decode-process``: the decode's loop in a process of its own (its own CUDA context and GIL)."""
    _, out_type, roi, load = next(c for c in CONFIGS if c[0] == config)
    jpegs = _jpegs(256)
    pipe = _pipeline(jpegs, out_type, roi, load, True)
    for _ in range(3):
        _once(pipe, jpegs)
    ready.set()
    while not stop.is_set():
        t0 = time.perf_counter()
        _once(pipe, jpegs)
        with done.get_lock():
            done.value += 1
        time.sleep(max(0.0, pace_s - (time.perf_counter() - t0)))


def _beside_process(model: _Model, config: str, pace_s: float, n: int = 60) -> dict[str, float]:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    stop, ready, done = ctx.Event(), ctx.Event(), ctx.Value("l", 0)
    child = ctx.Process(target=_child, args=(config, pace_s, stop, done, ready), daemon=True)
    child.start()
    ready.wait(120)
    time.sleep(0.3)
    t0, d0 = time.perf_counter(), done.value
    figures: dict[str, Any] = model.steps(n)
    figures["decode_batches_s"] = (done.value - d0) / (time.perf_counter() - t0)
    figures.update(model.kernel_ms())
    figures.update(model.launch_ms())
    figures["decode_batches_s_after_launch_probe"] = (done.value - d0) / (time.perf_counter() - t0)
    stop.set()
    child.join(60)
    return figures


def _beside(model: _Model, pipe: Any, jpegs: list[Any], pace_s: float, n: int = 60,
            kernels: bool = False) -> dict[str, float]:
    stop, done, spent = threading.Event(), [0], {}

    def run() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            _once(pipe, jpegs, spent if figures_started.is_set() else None)
            done[0] += 1
            time.sleep(max(0.0, pace_s - (time.perf_counter() - t0)))

    figures_started = threading.Event()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.3)
    figures_started.set()
    t0, d0 = time.perf_counter(), done[0]
    figures: dict[str, Any] = model.steps(n)
    figures["decode_batches_s"] = (done[0] - d0) / (time.perf_counter() - t0)
    figures["decode_thread_ms_per_batch"] = {k: 1000 * v / max(1, done[0] - d0) for k, v in spent.items()}
    if kernels and model.gpu:
        figures.update(model.kernel_ms())
        figures.update(model.launch_ms())
    stop.set()
    thread.join()
    return figures


def probe(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from lightning_gpu_boost.core.results import environment

    gpu = torch.cuda.is_available()
    jpegs = _jpegs(256 if gpu else 8)
    model = _Model(gpu, sync=not args.no_sync, priority=args.train_priority)
    if args.warm_beside:  # cuDNN's benchmark picks the step's algorithms at its first steps: here beside a decode
        _, out_type, roi, load = next(c for c in CONFIGS if c[0] == args.warm_beside)
        _beside(model, _pipeline(jpegs, out_type, roi, load, gpu), jpegs, args.pace_ms / 1000, n=5)
    result: dict[str, Any] = {"environment": environment(), "config": vars(args), "alone": model.steps()}
    if gpu:
        result["alone"].update(model.kernel_ms())
        result["alone"].update(model.launch_ms())
    print(f"{len(jpegs)} JPEGs; alone {result['alone']}", flush=True)
    for name, out_type, roi, load in CONFIGS:
        if args.only and name not in args.only:
            continue
        try:
            t0 = time.perf_counter()
            pipe = _pipeline(jpegs, out_type, roi, load, gpu)
            figures: dict[str, Any] = {"out_shape": _once(pipe, jpegs)}
            for _ in range(3):
                _once(pipe, jpegs)
            t1 = time.perf_counter()
            for _ in range(10):
                _once(pipe, jpegs)
            figures.update(build_s=t1 - t0, decode_alone_batches_s=10 / (time.perf_counter() - t1),
                           kernels=_kernels(pipe, jpegs) if gpu else {},
                           beside_resnet18=_beside(model, pipe, jpegs, args.pace_ms / 1000, kernels=True))  # fmt: skip
            del pipe
            if args.decode_process:  # the same decode in a process of its own, beside the same step
                figures["beside_resnet18_other_process"] = _beside_process(model, name, args.pace_ms / 1000)
        except Exception as e:  # a configuration DALI refuses: said, the others go on
            figures = {"error": f"{type(e).__name__}: {e}"[:400]}
        result[name] = figures
        print(name, json.dumps(figures)[:1500], flush=True)
        (Path(args.out) / "probe.json").write_text(json.dumps(result, indent=1))
    result["alone_again"] = model.steps()
    (Path(args.out) / "probe.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="/tmp/interference", help="where probe.json (or, with --convert, the "
                        "result file) goes")  # fmt: skip
    parser.add_argument("--pace-ms", type=float, default=25.0, help="the decode thread's least time a batch")
    parser.add_argument("--no-sync", action="store_true", help="no wait for each step's loss")
    parser.add_argument("--warm-beside", choices=[c[0] for c in CONFIGS], help="the model's first steps (where "
                        "cuDNN's benchmark picks its algorithms) beside this decode, not alone")  # fmt: skip
    parser.add_argument("--train-priority", type=int, help="the step on a stream of this priority (lower is "
                        "higher; -5 is clamped to the highest), not on the default stream")  # fmt: skip
    parser.add_argument("--decode-process", action="store_true", help="each decode also in a process of its "
                        "own beside the step (its own CUDA context and GIL)")  # fmt: skip
    parser.add_argument("--only", nargs="+", choices=[c[0] for c in CONFIGS], help="these configurations only")
    parser.add_argument("--convert", help="a raw probe.json to write as the result file")
    parser.add_argument("--suffix", help="with --convert: after the machine in the file's name (another of one day)")
    args = parser.parse_args()
    if args.convert:
        from lightning_gpu_boost.core.results import write_result

        raw = json.loads(Path(args.convert).read_text())
        env = raw.pop("environment")
        tag = f"h200-{args.suffix}" if args.suffix else "h200"
        print(write_result("gpu_decode_interference", raw, {}, out_dir=args.out, env=env, tag=tag))
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    probe(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
