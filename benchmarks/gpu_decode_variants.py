"""The GPU decode's hand-over to DALI, variant by variant (``benchmarks/gpu_decode.py --parts handover_resnet18``):
the ``gpu`` case of a model with DALI's windows taken each way, side by side with the ceiling, in one run.

Variants (:data:`VARIANTS`): how many pipelines take turns; DALI's outputs and the copy waited for by the training
thread (as before the hand-over stopped waiting) or not; the JPEGs pinned (as before); the batch's resampling left
out (its images zeros: what the resampling costs the step, a diagnosis); and DALI resizing the windows itself
(``fn.resize``, antialiased linear, then ``fn.flip``) instead of the package's batched products, over each JPEG's
window or over the whole image (no region for the JPEG engines to crop), an experiment whose values
:func:`resize_parity` compares with the package's.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliWindows


def copy_and_wait(self: Any, dense: Any, k: int) -> torch.Tensor:
    """``DaliWindows._to_torch`` as it was before the hand-over stopped waiting: a copy on a stream of its own that
    the training thread waits for (the ``copy_wait`` variant of the ``handover`` part)."""
    from nvidia.dali.plugin.pytorch import feed_ndarray

    windows = torch.empty(tuple(dense.shape()), dtype=torch.uint8, device=self.device)
    with torch.cuda.stream(self._stream):
        feed_ndarray(dense, windows, cuda_stream=self._stream.cuda_stream)
    self._stream.synchronize()
    return windows


#: the ``handover`` part's variants: (pipes, what else changes)
VARIANTS = {"copy_wait_2": (2, "wait"), "host_synced_2": (2, "host_synced"), "copy_2": (2, ""), "copy_3": (3, ""),
            "copy_2_no_resample": (2, "no_resample"), "copy_2_pinned_jpegs": (2, "pinned"),
            "dali_resize_2": (2, "dali_resize"), "dali_whole_resize_2": (2, "dali_whole_resize")}  # fmt: skip


def handover(root: Path, arch: str, args: argparse.Namespace, fit_case: Any) -> dict[str, Any]:
    """The ``gpu`` case of ``arch`` with DALI's windows taken each way (:data:`VARIANTS`), side by side with the
    ceiling: how many pipelines take turns, DALI's outputs and the copy waited for by the training thread (as before)
    or not, the JPEGs pinned, DALI resizing the windows itself, and, as a diagnosis, the batch's resampling
    left out (its images are zeros: what the resampling costs the step). Each case records the training thread's
    time per batch in DALI's calls (``DaliWindows.timings``); ``fit_case``: ``gpu_decode.py``'s."""
    from unittest import mock

    from lightning_gpu_boost.core.gpu_decode import decode as decode_module
    from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliWindows

    cases: dict[str, Any] = {"ceiling": fit_case(root, arch, None, args)}
    print(f"handover {arch}: ceiling {cases['ceiling']['samples_per_s']:,.0f} img/s", flush=True)
    for name in args.variants.split(","):
        pipes, extra = VARIANTS[name]
        made: list[DaliWindows] = []

        def windows(device: Any, made=made, pipes=pipes, extra=extra) -> DaliWindows:
            if extra in ("dali_resize", "dali_whole_resize"):
                made.append(ResizingWindows(device, whole=extra == "dali_whole_resize", pipes=pipes))
            else:
                made.append(DaliWindows(device, pipes=pipes))
            made[-1].bind_outputs = extra not in ("wait", "host_synced")  # DALI's outputs waited for by the thread
            return made[-1]

        patches = [mock.patch.object(decode_module, "DaliWindows", windows)]
        if extra == "wait":
            patches.append(mock.patch.object(DaliWindows, "_to_torch", copy_and_wait))
        if extra == "no_resample":
            patches.append(mock.patch.object(decode_module.BatchDecoder, "_resample_windows", lambda self, w, g, size:
                                             torch.zeros((w.shape[0], 3, *size), device=w.device)))  # fmt: skip
        if extra in ("dali_resize", "dali_whole_resize"):
            patches += [mock.patch.object(decode_module.BatchDecoder, "_submit", submit_resized),
                        mock.patch.object(decode_module.BatchDecoder, "_resample_windows", resized_images)]  # fmt: skip
        if extra == "pinned":  # the pin-memory thread pins the JPEGs' bytes too (as before)
            from lightning_gpu_boost.core.gpu_decode.records import RecordBatch

            def pin_all(self: Any, device: Any = None) -> Any:
                pin = (lambda x: x.pin_memory() if x is not None else None)  # noqa: E731
                return RecordBatch(self.size, pin(self.pixels), self.pixel_index, pin(self.jpeg), self.lengths,
                                   self.ops, self.jpeg_index, self.share, self.geometry, self.made_at)  # fmt: skip

            patches.append(mock.patch.object(RecordBatch, "pin_memory", pin_all))
        for patch in patches:
            patch.start()
        try:
            result = fit_case(root, arch, "gpu", args)
        finally:
            for patch in reversed(patches):
                patch.stop()
        keys = ("submit_s", "feed_s", "schedule_s", "wait_s", "handover_s")
        t = {k: sum(d.timings[k] for d in made) for k in ("batches", *keys)}
        n = max(1, t["batches"])
        result["thread_ms_per_batch"] = {k[:-2]: 1000 * t[k] / n for k in keys}
        result["of_ceiling"] = result["samples_per_s"] / cases["ceiling"]["samples_per_s"]
        cases[name] = result
        print(f"handover {arch}: {name} {result['samples_per_s']:,.0f} img/s ({result['of_ceiling']:.3f}), "
              f"wait {result['data_wait_frac']:.3f}, thread ms/batch {result['thread_ms_per_batch']}", flush=True)
    return {"arch": arch, "worker_cpus": len(os.sched_getaffinity(0)), "cases": cases}


class ResizingWindows(DaliWindows):
    """:class:`DaliWindows` whose pipelines also resize each window to the batch's image size (``fn.resize``,
    antialiased linear, over the region of the window the records' geometry maps onto the output) and flip it
    (``fn.flip``): the batch comes back as ``(n, H, W, 3)`` uint8 images, not windows to resample. ``whole``: each
    JPEG decoded whole (``fn.decoders.image``, no region for the JPEG engines to crop) and the region taken in the
    image's coordinates."""

    def __init__(self, device: Any, whole: bool = False, **kwargs: Any) -> None:
        super().__init__(device, **kwargs)
        self.whole, self.size = whole, None

    def submit_geometry(self, rows: np.ndarray, lengths: np.ndarray, geometry: np.ndarray, capacity: int,
                        size: tuple[int, int]) -> int:  # fmt: skip
        """:meth:`DaliWindows.submit` from the records' geometry (11 ints per JPEG: rows' start, length, resized,
        offset, out; the columns'; flip) and the images' ``size``."""
        n = len(rows)
        self.size = self.size or size
        g = geometry.astype(np.float64)
        scale_y, scale_x = g[:, 1] / g[:, 2], g[:, 6] / g[:, 7]
        top, left = (g[:, 0], g[:, 5]) if self.whole else (0.0, 0.0)  # the window's place in what is decoded
        inputs = {"jpegs": rows, "lengths": np.asarray(lengths, np.int32).reshape(n, 1),
                  "roi_start": np.stack([top + g[:, 3] * scale_y, left + g[:, 8] * scale_x], 1).astype(np.float32),
                  "roi_end": np.stack([top + (g[:, 3] + g[:, 4]) * scale_y, left + (g[:, 8] + g[:, 9]) * scale_x],
                                      1).astype(np.float32),
                  "flip": np.ascontiguousarray(geometry[:, 10], dtype=np.int32)}  # fmt: skip
        if not self.whole:
            inputs["anchor"] = np.ascontiguousarray(geometry[:, [0, 5]], dtype=np.int32)
            inputs["shape"] = np.ascontiguousarray(geometry[:, [1, 6]], dtype=np.int32)
        return self._hand_over(n, capacity, inputs)

    def _graph(self, fn: Any, types: Any, gpu: bool) -> Any:
        rows = fn.external_source(name="jpegs", dtype=types.UINT8, no_copy=True, ndim=1)
        jpegs = fn.slice(rows, start=[0], shape=fn.external_source(name="lengths", dtype=types.INT32), axes=[0])
        extra = {"hw_decoder_load": self.hw_decoder_load, "device": "mixed"} if gpu else {"device": "cpu"}
        if self.whole:
            images = fn.decoders.image(jpegs, output_type=types.RGB, adjust_orientation=False, **extra)
        else:
            images = fn.decoders.image_slice(jpegs, fn.external_source(name="anchor", dtype=types.INT32),
                                             fn.external_source(name="shape", dtype=types.INT32), axis_names="HW",
                                             output_type=types.RGB, adjust_orientation=False, **extra)  # fmt: skip
        images = fn.resize(images, size=list(self.size), roi_start=fn.external_source(name="roi_start"),
                           roi_end=fn.external_source(name="roi_end"), roi_relative=False, antialias=True,
                           interp_type=types.INTERP_LINEAR)  # fmt: skip
        return fn.flip(images, horizontal=fn.external_source(name="flip"))


def submit_resized(self: Any, records: Any) -> int:
    """``BatchDecoder._submit`` handing the records' geometry and image size to :class:`ResizingWindows`."""
    return self._dali.submit_geometry(records.jpeg.numpy(), np.asarray(records.lengths), records.geometry.numpy(),
                                      records.size, self._shape(records)[1:])  # fmt: skip


def resized_images(self: Any, images: torch.Tensor, geometry: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``BatchDecoder._resample_windows`` for :class:`ResizingWindows`' images: they are resized already (rounded
    8-bit values, as PIL's)."""
    return images.permute(0, 3, 1, 2)


def resize_parity(batches: list[Any], device: str, mean: tuple, std: tuple, whole: bool = False) -> dict[str, float]:
    """The images of DALI's resize (of each JPEG's window, or of the whole image with ``whole``) against the
    package's resampling of the same records (8-bit levels: mean and max absolute difference over ``batches``)."""
    import types

    from lightning_gpu_boost.core.gpu_decode import BatchDecoder

    package = BatchDecoder(mean, std, device=device)
    resizing = BatchDecoder(mean, std, device=device)
    resizing._dali = ResizingWindows(device, whole=whole)
    resizing._submit = types.MethodType(submit_resized, resizing)
    resizing._resample_windows = types.MethodType(resized_images, resizing)
    scale = torch.tensor(std, device=device).view(1, 3, 1, 1) * 255
    total, count, most = 0.0, 0, 0.0
    for batch in batches:
        a = package.end(package.begin([batch]))[0]
        b = resizing.end(resizing.begin([batch]))[0]
        levels = ((a - b) * scale).abs()
        total, count, most = total + float(levels.sum()), count + levels.numel(), max(most, float(levels.max()))
    package.close()
    resizing.close()
    return {"mean_abs_levels": total / count, "max_abs_levels": most}
