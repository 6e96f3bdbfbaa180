"""The GPU decode's hand-over to DALI, variant by variant (``benchmarks/gpu_decode.py --parts handover_resnet18``):
the ``gpu`` case of a model with DALI's windows taken each way, side by side with the ceiling, in one run.

Variants (:data:`VARIANTS`): how many pipelines take turns; DALI's outputs and the copy waited for by the training
thread or not; the JPEGs' bytes pinned by the pin-memory thread or not; 4 or 2 CPU threads per pipeline instead
of 8 (with the JPEG engines decoding, DALI's threads only parse and cut: fewer leave the training thread more of
the CPU); the loader's workers held to 4 (AutoNumWorkers off) instead of the count it picks: what CPU threads beside the
training process's cost it; each batch's per-sample numbers handed to DALI as seven inputs instead of one
(:class:`SevenInputWindows`); the package's training stream (``TrainStream``) at the device's highest priority (``train_priority``: the
decode's kernels take only the SMs the step leaves free; with the decode beside it, ResNet-50's step took 60.9 ms
of GPU time instead of 54.4, with no gaps between steps); a split of each batch set by the benchmark (``split_S``:
GPU share S, the workers decode the rest), and the loader's workers kept off the first N CPUs (``reserve_N``: the
training thread, the pin-memory thread and DALI's threads then do not wait for a CPU behind a worker's decode);
the workers at a higher niceness (``nice_N``); ``split_0``: the CPU decode through the
same stage; the interpreter's switch interval at 1 ms instead of 5 (``switch_1ms``: how long the training thread waits for the
GIL behind the pin-memory thread); ``GPUBoost(watchdog=False)`` (``no_watchdog``: what the watchdog's per-step work
costs the training thread); the workers held to 8; DALI driven from a thread of its own (``handover_thread``:
the fetch, the hand-over, the collect and the normalize off the training thread; the package's default) or from
the training thread between the steps (``inline``). ``layout``: a mixed batch gathered in
the normalize's layout (``BatchDecoder._gather_in_layout``). ``hw_N``: N % of each batch for the JPEG engines
instead of all (DALI's ``hw_decoder_load``; the rest nvJPEG's CUDA decoder, its Huffman stage on DALI's CPU
threads): beside ResNet-50 on the H200 the engines' output took a conversion kernel per image (``rgba2rgb``, 1.1 ms
of the GPU's time a step), where ``DALIDataModule``'s decode, the engines idle, took 0.8 ms in all and its step
0.2 ms over the ceiling's. ``legacy_exec``: DALI's older pipelined executor (the dynamic one's threads took 0.6-2.3
cores beside the engines, 0.1 beside the CUDA decoder; blocking CUDA's waits did not lower it).
``pin_in_handover``: no pin-memory thread (:class:`NoPinLoader`). ``no_backward_window``: the hand-over thread starts each batch's work (the fetch, the hand-over to DALI, the
collect) whenever the training thread takes a batch, instead of while it is in ``backward``, where it holds no GIL
(the package's ``BackwardWindow``): ResNet-18's step waits for its launches, not its kernels
(``gpu_decode_interference.py``). ``default_stream``: training on the thread's stream as it is (CUDA's legacy
default stream, which every blocking stream's work orders with), not the package's ``TrainStream``; ``legacy_exec``
ran 352 img/s (DALI's older executor stalled). A variant named twice is timed twice.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliWindows


class SevenInputWindows(DaliWindows):
    """:class:`DaliWindows` fed each batch's per-sample numbers as seven inputs (the JPEG's length, the window's
    anchor, its shape, the output size, the region's start and end, the flip) instead of one float32 row (the
    ``seven_inputs`` variant)."""

    def _graph(self, fn: Any, types: Any, gpu: bool) -> Any:
        rows = fn.external_source(name="jpegs", dtype=types.UINT8, no_copy=True, ndim=1)
        jpegs = fn.slice(rows, start=[0], shape=fn.external_source(name="lengths", dtype=types.INT32), axes=[0])
        anchor = fn.external_source(name="anchor", dtype=types.INT32)
        shape = fn.external_source(name="shape", dtype=types.INT32)
        extra = {"hw_decoder_load": self.hw_decoder_load} if gpu else {}
        windows = fn.decoders.image_slice(jpegs, anchor, shape, axis_names="HW", output_type=types.RGB,
                                          device="mixed" if gpu else "cpu", adjust_orientation=False, **extra)  # fmt: skip
        images = fn.resize(windows, size=fn.external_source(name="size", dtype=types.FLOAT),
                           roi_start=fn.external_source(name="roi_start", dtype=types.FLOAT),
                           roi_end=fn.external_source(name="roi_end", dtype=types.FLOAT), roi_relative=False,
                           antialias=True, interp_type=types.INTERP_LINEAR)  # fmt: skip
        return fn.flip(images, horizontal=fn.external_source(name="flip", dtype=types.INT32))

    def submit(self, jpegs: np.ndarray, lengths: np.ndarray, geometry: np.ndarray, capacity: int = 0) -> int:
        n = len(jpegs)
        g = np.asarray(geometry, dtype=np.float64)
        scale = g[:, [1, 6]] / g[:, [2, 7]]
        start = g[:, [3, 8]] * scale
        inputs = {"jpegs": jpegs, "lengths": np.asarray(lengths, np.int32).reshape(n, 1),
                  "anchor": np.ascontiguousarray(geometry[:, [0, 5]], dtype=np.int32),
                  "shape": np.ascontiguousarray(geometry[:, [1, 6]], dtype=np.int32),
                  "size": np.ascontiguousarray(g[:, [4, 9]], dtype=np.float32),
                  "roi_start": np.ascontiguousarray(start, dtype=np.float32),
                  "roi_end": np.ascontiguousarray(start + g[:, [4, 9]] * scale, dtype=np.float32),
                  "flip": np.ascontiguousarray(geometry[:, 10], dtype=np.int32)}  # fmt: skip
        return self._hand_over(n, capacity, inputs)


class FlipKernelWindows(DaliWindows):
    """:class:`DaliWindows` with the flip as a step of its own after the resize (DALI's ``fn.flip``: a kernel per
    sample) instead of in the resize's region (the ``flip_kernel`` variants: the flip's cost on the GPU, side by
    side). On DALI's CPU backend its images are bit-identical to :class:`DaliWindows`'."""

    def _graph(self, fn: Any, types: Any, gpu: bool) -> Any:
        return fn.flip(super()._graph(fn, types, gpu), horizontal=fn.external_source(name="flip", dtype=types.INT32))

    def submit(self, jpegs: np.ndarray, lengths: np.ndarray, geometry: np.ndarray, capacity: int = 0) -> int:
        unflipped = np.array(geometry, copy=True)
        unflipped[:, 10] = 0
        self._flips = np.ascontiguousarray(geometry[:, 10], dtype=np.int32)
        return super().submit(jpegs, lengths, unflipped, capacity)

    def _hand_over(self, n: int, capacity: int, inputs: dict[str, np.ndarray]) -> int:
        return super()._hand_over(n, capacity, {**inputs, "flip": self._flips})


def copy_and_wait(self: Any, dense: Any, k: int) -> torch.Tensor:
    """``DaliWindows._to_torch`` with a copy on a stream of its own that the training thread waits for (the
    ``copy_wait`` variant of the ``handover`` part)."""
    from nvidia.dali.plugin.pytorch import feed_ndarray

    windows = torch.empty(tuple(dense.shape()), dtype=torch.uint8, device=self.device)
    with torch.cuda.stream(self._stream):
        feed_ndarray(dense, windows, cuda_stream=self._stream.cuda_stream)
    self._stream.synchronize()
    return windows


#: the ``handover`` part's variants: (pipes, what else changes)
VARIANTS = {"copy_wait_2": (2, "wait"), "host_synced_2": (2, "host_synced"), "copy_2": (2, ""), "copy_3": (3, ""),
            "copy_4": (4, ""), "copy_2_pinned_jpegs": (2, "pinned"), "copy_2_threads_4": (2, "threads_4"),
            "copy_2_workers_4": (2, "workers_4"), "copy_3_seven_inputs": (3, "seven"),
            "copy_3_train_priority": (3, "priority"), "copy_3_threads_2": (3, "threads_2"),
            "copy_3_reserve_3": (3, "reserve_3"), "split_30": (3, "split_0.3"),
            "split_30_reserve_3": (3, "split_0.3+reserve_3"), "split_50_reserve_3": (3, "split_0.5+reserve_3"),
            "split_70_reserve_3": (3, "split_0.7+reserve_3"), "split_85_reserve_2": (3, "split_0.85+reserve_2"),
            "copy_3_switch_1ms": (3, "switch_0.001"), "copy_3_no_watchdog": (3, "watchdog_off"),
            "copy_3_workers_8": (3, "workers_8"), "split_0": (3, "split_0.0"), "split_0_nice_10": (3, "split_0.0+nice_10"),
            "split_15_nice_10": (3, "split_0.15+nice_10"), "split_30_nice_10": (3, "split_0.3+nice_10"),
            "split_50_nice_10": (3, "split_0.5+nice_10"), "split_70_nice_10": (3, "split_0.7+nice_10"),
            "copy_3_nice_10": (3, "nice_10"), "copy_3_handover_thread": (3, "thread"),
            "copy_3_inline": (3, "inline"),
            "split_15_layout": (3, "split_0.15+layout"), "split_30_layout": (3, "split_0.3+layout"),
            "split_70_layout": (3, "split_0.7+layout"), "copy_3_flip_kernel": (3, "flipkernel"),
            "split_30_reserve_3_flip_kernel": (3, "split_0.3+reserve_3+flipkernel"), "copy_3_by_name": (3, "byname"),
            "copy_3_hw_0": (3, "hw_0"), "copy_3_hw_50": (3, "hw_50"), "copy_3_legacy_exec": (3, "legacyexec"),
            "copy_3_no_backward_window": (3, "anywindow"), "copy_3_pin_in_handover": (3, "nopin"),
            "copy_3_default_stream": (3, "defaultstream")}  # fmt: skip


class NoPinLoader(DataLoader):
    """The ``pin_in_handover`` variant's loader: no pin-memory thread, whatever ``StreamPrefetch`` sets. The
    hand-over thread then receives each batch from the workers (the descriptors, the unpickling: 4.0 ms of CPU a
    batch on a 2-CPU machine) and pins it, in the backward window, instead of a thread that takes the GIL whenever
    a worker's batch arrives."""

    @property
    def pin_memory(self) -> bool:
        return False

    @pin_memory.setter
    def pin_memory(self, value: bool) -> None:
        pass


def keep_off_cpus(reserved: int, nice: int, worker_id: int, by_name: bool = False) -> None:
    """A loader worker's ``worker_init_fn`` in the ``reserve_N`` variants: the worker runs on all but the first
    ``reserved`` CPUs of the process's, which the training thread, the pin-memory thread and DALI's threads keep;
    in the ``nice_N`` variants it runs at a niceness ``N`` higher (the training process's threads take a CPU
    from a worker when they need one, and the workers keep every CPU otherwise); in ``by_name`` its batches'
    tensors cross by the name of their shared memory (torch's ``file_system`` strategy) instead of a descriptor
    the training process fetches from the worker through a socket, two round trips a batch (the JPEG rows and the
    labels), each waiting for the busy worker's GIL. Not for the package as it is: on a 2-CPU machine a loader torn
    down at its process's exit left a batch's segment in /dev/shm."""
    if by_name:
        torch.multiprocessing.set_sharing_strategy("file_system")
    if reserved:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpus[reserved:] or cpus)
    if nice:
        os.nice(nice)


def forced_split(share: float) -> Any:
    """``StreamPrefetch``'s ``GPUDecodeStage`` with the GPU share fixed at ``share`` (the ``split_S`` variants): the
    workers decode the rest of each batch, as ``decode="auto"`` does where it keeps a split."""
    from lightning_gpu_boost.callbacks._gpu_decode import GPUDecodeStage

    def stage(mode: str) -> GPUDecodeStage:
        made = GPUDecodeStage("gpu")
        made.share, made.why = share, f"a split set by the benchmark: GPU share {share}"
        return made

    return stage


def handover(root: Path, arch: str, args: argparse.Namespace, fit_case: Any) -> dict[str, Any]:
    """The ``gpu`` case of ``arch`` with DALI's images taken each way (:data:`VARIANTS`), side by side with the
    ceiling: how many pipelines take turns, DALI's outputs and the copy waited for by the training thread or not,
    the JPEGs pinned or not, DALI's threads, the loader's workers. Each case records the training thread's time per
    batch in DALI's calls (``DaliWindows.timings``); ``fit_case``: ``gpu_decode.py``'s."""
    from unittest import mock

    from lightning_gpu_boost.core.gpu_decode import decode as decode_module

    cases: dict[str, Any] = {"ceiling": fit_case(root, arch, None, args)}
    print(f"handover {arch}: ceiling {cases['ceiling']['samples_per_s']:,.0f} img/s", flush=True)
    from lightning_gpu_boost.callbacks import stream_prefetch as prefetch_module

    for name in args.variants.split(","):
        pipes, extra = VARIANTS[name]
        tokens = dict(t.rsplit("_", 1) if "_" in t else (t, "") for t in extra.split("+") if t)
        made: list[DaliWindows] = []

        def windows(device: Any, hw_decoder_load: float | None = None, made=made, pipes=pipes, extra=extra,
                    tokens=tokens) -> DaliWindows:  # fmt: skip
            kind = SevenInputWindows if extra == "seven" else FlipKernelWindows if "flipkernel" in tokens else (
                DaliWindows)  # fmt: skip
            # the decoder's load where BatchDecoder asks for one (else it would build pipelines again every batch)
            load = int(tokens.get("hw", 100)) / 100 if hw_decoder_load is None else hw_decoder_load
            made.append(kind(device, pipes=pipes, threads=int(tokens.get("threads", 8)), hw_decoder_load=load))
            made[-1].bind_outputs = extra not in ("wait", "host_synced")  # DALI's outputs waited for by the thread
            return made[-1]

        patches = [mock.patch.object(decode_module, "DaliWindows", windows)]
        if "split" in tokens:
            patches.append(mock.patch.object(prefetch_module, "GPUDecodeStage", forced_split(float(tokens["split"]))))
        if extra == "legacyexec":  # DALI's older pipelined executor instead of the dynamic one
            patches.append(mock.patch.object(DaliWindows, "_exec_dynamic", False))
        if extra == "wait":
            patches.append(mock.patch.object(DaliWindows, "_to_torch", copy_and_wait))
        if "layout" in tokens:  # a mixed batch gathered in the normalize's layout
            from lightning_gpu_boost.core.gpu_decode.decode import BatchDecoder

            patches.append(mock.patch.object(BatchDecoder, "_gather_in_layout", True))
        if extra == "thread":  # DALI driven from a thread of its own: the training thread takes finished batches
            from lightning_gpu_boost.core.prefetch import StreamPrefetcher

            patches.append(mock.patch.object(StreamPrefetcher, "_handover_thread", True))
        if extra == "anywindow":  # the hand-over thread's work whenever a batch is taken, not in backward only
            patches.append(mock.patch.object(prefetch_module.StreamPrefetch, "_backward_window", False))
        if extra in ("priority", "defaultstream"):  # the package's training stream at the highest priority, or none
            patches.append(mock.patch.object(prefetch_module.StreamPrefetch, "_train_stream_priority",
                                             -100 if extra == "priority" else None))  # fmt: skip
        if extra == "inline":  # DALI driven from the training thread, between the steps
            from lightning_gpu_boost.core.prefetch import StreamPrefetcher

            patches.append(mock.patch.object(StreamPrefetcher, "_handover_thread", False))
        if extra == "pinned":  # the pin-memory thread pins the JPEGs' bytes too
            from lightning_gpu_boost.core.gpu_decode.records import RecordBatch

            def pin_all(self: Any, device: Any = None) -> Any:
                pin = (lambda x: x.pin_memory() if x is not None else None)  # noqa: E731
                return RecordBatch(self.size, pin(self.pixels), self.pixel_index, pin(self.jpeg), self.lengths,
                                   self.ops, self.jpeg_index, self.share, self.geometry, self.made_at,
                                   self.made_by)  # fmt: skip

            patches.append(mock.patch.object(RecordBatch, "pin_memory", pin_all))
        for patch in patches:
            patch.start()
        try:
            case_args = argparse.Namespace(**vars(args), loader_workers=int(tokens["workers"]) if "workers" in tokens
                                           else None,
                                           reserve_cpus=int(tokens.get("reserve", 0)),
                                           nice_workers=int(tokens.get("nice", 0)), by_name="byname" in tokens,
                                           no_pin="nopin" in tokens,
                                           watchdog=tokens.get("watchdog") != "off")  # fmt: skip
            switch = sys.getswitchinterval()
            sys.setswitchinterval(float(tokens.get("switch", switch)))
            try:
                result = fit_case(root, arch, "gpu", case_args)
            finally:
                sys.setswitchinterval(switch)
        finally:
            for patch in reversed(patches):
                patch.stop()
        keys = ("submit_s", "feed_s", "schedule_s", "wait_s", "handover_s")
        t = {k: sum(d.timings[k] for d in made) for k in ("batches", *keys)}
        n = max(1, t["batches"])
        result["thread_ms_per_batch"] = {k[:-2]: 1000 * t[k] / n for k in keys}
        result["of_ceiling"] = result["samples_per_s"] / cases["ceiling"]["samples_per_s"]
        cases[name if name not in cases else f"{name}_again"] = result  # a variant named twice: timed twice
        print(f"handover {arch}: {name} {result['samples_per_s']:,.0f} img/s ({result['of_ceiling']:.3f}), "
              f"wait {result['data_wait_frac']:.3f}, thread ms/batch {result['thread_ms_per_batch']}", flush=True)
    return {"arch": arch, "worker_cpus": len(os.sched_getaffinity(0)), "cases": cases}
