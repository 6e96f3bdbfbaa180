"""Diagnosis: where the GPU idles when DALIDataModule feeds ResNet-50 in a Lightning Trainer (a CUDA trace).

    python benchmarks/dali_trace.py

1. A plain PyTorch loop (no Lightning), same model and step: the batch already on the GPU vs DALILoader batches,
   so Lightning's share of the gap to the ceiling is visible.
2. In a Lightning Trainer (ceiling, then DALI from the folder), after one epoch of warm-up, ``--trace-steps`` steps
   under ``torch.profiler`` (CUDA activity: every kernel and copy of the process, DALI's included, and the CUDA
   runtime calls of every thread). The summary: the GPU's idle time between kernels, the longest idle gaps with the
   stream whose work ended each and the host calls that spanned it, the GPU time per step on each stream, and the
   CUDA runtime calls that took the most time. The raw traces are written next to the result (gzipped JSON, open
   them in Perfetto or chrome://tracing).
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import lightning.pytorch as pl
import torch
from _common import demo_tree, fit_resnet50, parser_for
from dali_loop import plain_loop

from lightning_gpu_boost.callbacks.throughput_meter import ThroughputMeter
from lightning_gpu_boost.core.results import write_result
from lightning_gpu_boost.core.steady import ResidentBatches
from lightning_gpu_boost.datamodules.dali import DALIDataModule

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


class Trace(pl.Callback):
    """Profiles the steps ``[start, start + count)`` and writes the Chrome trace to ``path``."""

    def __init__(self, start: int, count: int, path: Path) -> None:
        self.start, self.count, self.path, self.prof = start, count, path, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.start and self.prof is None:
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.prof is not None and trainer.global_step == self.start + self.count:
            torch.cuda.synchronize()
            self.prof.__exit__(None, None, None)
            raw = self.path.with_suffix("")
            self.prof.export_chrome_trace(str(raw))
            self.path.write_bytes(gzip.compress(raw.read_bytes()))
            raw.unlink()
            self.prof = False


def summarize(path: Path, steps: int) -> dict:
    """Idle gaps of the GPU, GPU time per stream, slow CUDA runtime calls, from a Chrome trace."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    gpu = sorted(
        (e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS), key=lambda e: e["ts"]
    )
    runtime = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    per_stream: dict[str, float] = defaultdict(float)
    kernels: dict[str, int] = defaultdict(int)
    for e in gpu:
        stream = str(e.get("args", {}).get("stream", e.get("tid")))
        per_stream[stream] += e["dur"]
        kernels[stream] += 1
    gaps, end, last = [], None, None
    for e in gpu:
        if end is not None and e["ts"] > end:
            gaps.append((e["ts"] - end, end, last, e))
        if end is None or e["ts"] + e["dur"] > end:
            end, last = e["ts"] + e["dur"], e
    window = (end - gpu[0]["ts"]) if gpu else 0.0
    idle = sum(g[0] for g in gaps)
    longest = []
    for dur, start, before, after in sorted(gaps, key=lambda g: -g[0])[:12]:
        spanning = [
            f"{r['name']} ({r['dur'] / 1000:.1f} ms, tid {r['tid']})"
            for r in runtime
            if r["ts"] <= start + dur and r["ts"] + r["dur"] >= start and r["dur"] > 0.3 * dur
        ]
        longest.append({
            "idle_ms": dur / 1000,
            "at_ms": (start - gpu[0]["ts"]) / 1000,
            "ended_by": f"{before['name'][:60]} (stream {before.get('args', {}).get('stream')})",
            "resumed_by": f"{after['name'][:60]} (stream {after.get('args', {}).get('stream')})",
            "host_calls_spanning": spanning[:6],
        })  # fmt: skip
    calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for r in runtime:
        c = calls[r["name"]]
        c[0] += 1
        c[1] += r["dur"] / 1000
        c[2] = max(c[2], r["dur"] / 1000)
    top = sorted(calls.items(), key=lambda kv: -kv[1][1])[:15]
    return {
        "window_ms": window / 1000,
        "gpu_idle_ms": idle / 1000,
        "gpu_idle_frac": idle / window if window else 0.0,
        "idle_gaps_over_1ms": sum(1 for g in gaps if g[0] > 1000),
        "longest_gaps": longest,
        "gpu_ms_per_step_by_stream": {
            s: v / 1000 / steps for s, v in sorted(per_stream.items(), key=lambda kv: -kv[1])
        },
        "gpu_ops_per_step_by_stream": {s: kernels[s] / steps for s in per_stream},
        "runtime_calls_ms": {name: {"count": c, "total_ms": t, "max_ms": m} for name, (c, t, m) in top},
    }


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--warmup", type=int, default=32, help="untimed steps (default: one epoch)")
    parser.add_argument("--steps", type=int, default=64, help="timed steps of the plain loops")
    parser.add_argument("--trace-steps", type=int, default=8, help="steps under the profiler")
    parser.add_argument(
        "--options", default="", help="DALIDataModule options, e.g. pipelines=1,prefetch_queue_depth=4"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/dali_trace.py needs a CUDA GPU.")
    root = demo_tree(args)
    options = {"dtype": "bfloat16", "channels_last": True}
    for item in filter(None, args.options.split(",")):
        key, value = item.split("=", 1)
        options[key] = int(value) if value.isdigit() else value
    x = torch.randn(args.batch_size, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
    batch = (
        x.contiguous(memory_format=torch.channels_last),
        torch.randint(0, 100, (args.batch_size,), device="cuda"),
    )
    per_epoch = -(-args.images // args.batch_size)

    figures: dict = {"config": vars(args), "options": options}
    ceiling_plain = plain_loop(ResidentBatches(batch, per_epoch), args.steps, args.warmup)
    dm = DALIDataModule(str(root), batch_size=args.batch_size, **options)
    dm.setup("fit")
    dali_plain = plain_loop(dm.train_dataloader(), args.steps, args.warmup)
    dm.teardown("fit")
    figures["plain_loop"] = {
        "ceiling_img_s": ceiling_plain,
        "dali_img_s": dali_plain,
        "of_ceiling": dali_plain / ceiling_plain,
    }
    print(
        f"plain loop: ceiling {ceiling_plain:,.0f} img/s, DALI {dali_plain:,.0f} img/s = {100 * dali_plain / ceiling_plain:.1f} %"
    )

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in (
        ("ceiling", ResidentBatches(batch, per_epoch)),
        ("dali_folder", DALIDataModule(str(root), batch_size=args.batch_size, **options)),
    ):
        meter = ThroughputMeter(warmup=args.warmup)
        path = out / f"dali_trace-{name}.json.gz"
        fit_resnet50(
            data, args.warmup + args.trace_steps + 4, [meter, Trace(args.warmup, args.trace_steps, path)]
        )
        figures[name] = {"meter": meter.summary(), "trace": summarize(path, args.trace_steps)}
        print(name, json.dumps(figures[name], indent=1)[:4000])
    figures["lightning_of_ceiling"] = (
        figures["dali_folder"]["meter"]["samples_per_s"] / figures["ceiling"]["meter"]["samples_per_s"]
    )
    print(f"wrote {write_result('dali_trace', figures, {}, args.out)}")


if __name__ == "__main__":
    main()
