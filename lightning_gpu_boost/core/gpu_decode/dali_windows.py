"""Each JPEG's crop window decoded, resized and flipped by DALI pipelines, in threads that do not need the training
process's GIL.

A thread of the training process that decodes (nvImageCodec, nvJPEG through torchvision) needs Python's GIL for each
of its calls, and a training loop holds the GIL nearly all the time: beside ResNet-18's loop on an H200 such a thread
decoded 1,000-2,200 img/s, and decoding between the steps instead halved the model's rate. DALI parses and decodes
in C++ threads of its own: the prefetcher's thread only hands over each batch's bytes (one array, a JPEG per row: DALI
cuts each row to its length, where a list of JPEGs cost the handing thread 2 ms a batch on the H200) and each
sample's geometry (:meth:`DaliWindows.submit`), and later takes the batch's images as one tensor
(:meth:`DaliWindows.collect`). Pipelines take turns, so that batches are decoded while others train.

Each pipeline decodes the sample's window (the region the crop keeps) and resizes the part of it the output covers to
the output's size (DALI's ``fn.resize``: linear, antialiased, as PIL's bilinear resize), flipped where the sample's
draw says: the region's column start and end are swapped, which DALI's resize reads as a flip. A flip of its own
(``fn.flip``) launched a kernel per sample: 0.8-1.0 ms of the H200's time per batch of 256, of the 2.1-2.4 that the
decode's kernels took beside the step (``benchmarks/gpu_decode.py --kernel-profile``). DALI resizing in its
pipeline made the decode alone 1.7x as fast on the H200 as the package's batched resampling of the windows, within
0.05 levels of it on average and 3 at most (``benchmarks/gpu_decode.py``'s ``decoders`` part).

On a GPU the pipelines decode with DALI's ``mixed`` decoder (the JPEG engines for a share ``hw_decoder_load``,
nvJPEG's CUDA decoder for the rest); on a CPU device with DALI's CPU decoder (the same steps, for tests). The
images are bound to a stream of ours (DALI's GPU work is waited for there) and copied out of DALI's buffer on it,
ordered before the current stream's next work, without the training thread waiting for the GPU; a pipeline is fed
again only once that copy is done (by then it long is), so DALI never writes a buffer that is still being read.
Taking DALI's buffer itself through DLPack, as DALI's PyTorch plugin does, read wrong values on the H200 where the
reading stream lagged (``tests/core/gpu_decode/test_on_gpu.py`` keeps that case). A batch DALI fails on raises
:class:`DaliFailed` (the caller decodes it another way) and its pipeline is built again. A pipeline dropped is shut
down at once, and a process forked from this one forgets the pipelines it copied (``core/fork.py``). EXIF
orientation is not applied, as PIL's ``ImageFolder`` loader does not apply it. Framework-free.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from lightning_gpu_boost._imports import require
from lightning_gpu_boost.core.fork import keep_dali_out_of_forks, shut_dali

__all__ = ["DaliFailed", "DaliWindows"]

log = logging.getLogger(__name__)


class DaliFailed(RuntimeError):
    """DALI could not decode a batch (a JPEG it refuses); the batch is to be decoded another way."""


class DaliWindows:
    """Decode, resize and flip batches of JPEG windows through DALI pipelines that take turns.

    Args:
        device: where the windows are decoded (``cuda:N``: DALI's mixed decoder on GPU ``N``; ``cpu``: its CPU
            decoder).
        threads: CPU threads of each pipeline (parsing, and the share nvJPEG decodes in part on a CPU).
        hw_decoder_load: the share of each batch for the JPEG engines (DALI's setting; the rest: nvJPEG's CUDA
            decoder).
        pipes: pipelines that take turns (batches decoded at once). A batch is handed over ``pipes`` batches
            before the step takes it; with 2, ResNet-50's training thread waited 9.2 ms a batch for DALI's outputs
            on the H200, with 3, 2.0 ms (``benchmarks/gpu_decode.py``'s ``handover`` part).

    Attributes:
        timings: seconds the calling thread spent, summed over ``batches``: handing batches over (``submit_s``),
            waiting for DALI's outputs (``wait_s``), taking them into torch (``handover_s``); of the first and of
            feeding waiting batches at a collect, in ``feed_input`` (``feed_s``) and ``schedule_run``
            (``schedule_s``); building the pipelines and their first, full batch (``build_s``, not in ``submit_s``).


    Tickets are collected in the order they were submitted; more batches than pipelines may be submitted: a batch
    waits until a pipeline is free, and is decoded at the latest when it is collected. The images :meth:`collect`
    returns are ordered on the stream that was current there.

    Raises:
        ImportError: DALI is not installed (the message names the extra).
        ValueError: ``threads`` or ``pipes`` not an int ``>= 1``, or ``hw_decoder_load`` outside ``[0, 1]``.
    """

    #: DALI's dynamic executor (its default); ``False``: the older pipelined one (``benchmarks/gpu_decode.py``'s
    #: ``copy_3_legacy_exec`` variant: with the JPEG engines the dynamic executor's threads took 0.6-2.3 cores)
    _exec_dynamic = True

    def __init__(self, device: torch.device | str, threads: int = 8, hw_decoder_load: float = 1.0,
                 pipes: int = 3) -> None:  # fmt: skip
        for name, value in (("threads", threads), ("pipes", pipes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        if isinstance(hw_decoder_load, bool) or not isinstance(hw_decoder_load, (int, float)) or not (
                0.0 <= hw_decoder_load <= 1.0):  # fmt: skip
            raise ValueError(f"hw_decoder_load must be a number in [0, 1], got {hw_decoder_load!r}.")
        self.dali = require("nvidia.dali")  # an ImportError naming the extra for this torch's CUDA
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.threads, self.hw_decoder_load, self.pipes = threads, hw_decoder_load, pipes
        self._pipes: list[Any] = [None] * pipes
        self._capacity = 0  # the batch size the pipelines were built for
        self._next = 0  # the next ticket
        self._fed: dict[int, Any] = {}  # ticket -> what the pipeline holds (kept alive until it is collected)
        self._waiting: deque = deque()  # (ticket, the pipeline's inputs by name) not handed to a pipeline yet
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._copied: list[Any] = [None] * pipes  # per pipeline: (its last output, the event after its copy)
        self.bind_outputs = True  # False: DALI's outputs are waited for by this thread (a benchmark's variant)
        self.timings = {"batches": 0, "submit_s": 0.0, "wait_s": 0.0, "handover_s": 0.0, "feed_s": 0.0,
                        "schedule_s": 0.0, "build_s": 0.0}

    def _build(self, k: int) -> Any:
        from nvidia.dali import fn, types

        gpu = self.device.type == "cuda"
        graph = self.dali.pipeline_def(self._graph, batch_size=self._capacity, num_threads=self.threads,
                                       device_id=self.device.index if gpu else None, prefetch_queue_depth=1,
                                       exec_dynamic=self._exec_dynamic)  # fmt: skip
        keep_dali_out_of_forks()  # a DataLoader's worker forked meanwhile forgets it
        t0 = time.perf_counter()
        pipe = graph(fn, types, gpu)
        pipe.build()
        self.timings["build_s"] += time.perf_counter() - t0
        self._pipes[k] = pipe
        return pipe

    def _primed(self, k: int, inputs: dict[str, np.ndarray]) -> Any:
        """Pipeline ``k`` built and run once on a full batch (``inputs``' samples repeated to the capacity), waited
        for and dropped: nvImageCodec sizes the JPEG engines' share of a batch once, from the first batch it
        decodes, and sends the rest of every batch to nvJPEG's CUDA decoder, which decodes the Huffman codes on
        DALI's CPU threads. A first batch of a few JPEGs (the first after the placement's search moves a share to
        the GPU) would leave the engines those few of every later batch, and the training process's CPU threads the
        rest. A first batch that is full already is not run twice. Where that run fails, the pipeline is built again
        unprimed (the batch itself then fails at its collect, and its pipeline is built again)."""
        pipe = self._build(k)
        if len(inputs["jpegs"]) >= self._capacity:
            return pipe
        t0 = time.perf_counter()
        repeat = np.arange(self._capacity) % len(inputs["jpegs"])
        full = {name: np.ascontiguousarray(value[repeat]) for name, value in inputs.items()}
        try:
            for name, value in full.items():
                pipe.feed_input(name, value)
            pipe.schedule_run()
            pipe.share_outputs()
            if self._stream is not None:
                torch.cuda.synchronize(self.device)  # DALI's work on the repeated rows (read in place) is done
            pipe.release_outputs()
        except Exception as e:
            log.debug("DALI failed on a pipeline's first, full batch: %s", e)
            shut_dali(pipe)
            return self._build(k)
        finally:
            self.timings["build_s"] += time.perf_counter() - t0
        return pipe

    def _graph(self, fn: Any, types: Any, gpu: bool) -> Any:
        """The pipeline: each row cut to its JPEG, its window decoded, the region the output covers resized to the
        output's size (flipped where the region's start and end are swapped). Its external sources are the inputs
        :meth:`submit` hands over: the rows of bytes, and each sample's numbers as one float32 row (the JPEG's
        length, the window's anchor and shape, the output's size, the region resized), cut and cast here: one
        ``feed_input`` a batch for them, where seven took the training thread 0.74 ms a batch and one 0.41 with
        DALI's CPU backend (images bit-identical; counts below 2**24 are exact in float32)."""
        rows = fn.external_source(name="jpegs", dtype=types.UINT8, no_copy=True, ndim=1)
        numbers = fn.external_source(name="numbers", dtype=types.FLOAT, ndim=1)
        integers = fn.cast(numbers, dtype=types.INT32)
        jpegs = fn.slice(rows, start=[0], shape=integers[0:1], axes=[0])  # each row's JPEG, in DALI's threads
        extra = {"hw_decoder_load": self.hw_decoder_load} if gpu else {}
        windows = fn.decoders.image_slice(jpegs, integers[1:3], integers[3:5], axis_names="HW", output_type=types.RGB,
                                          device="mixed" if gpu else "cpu", adjust_orientation=False, **extra)  # fmt: skip
        return fn.resize(windows, size=numbers[5:7], roi_start=numbers[7:9], roi_end=numbers[9:11],
                         roi_relative=False, antialias=True, interp_type=types.INTERP_LINEAR)  # fmt: skip

    def submit(self, jpegs: np.ndarray, lengths: np.ndarray, geometry: np.ndarray, capacity: int = 0) -> int:
        """Hand over one batch: its JPEGs, one per row of ``jpegs`` (``(n, longest)`` uint8: ``lengths[k]`` bytes of
        row ``k``, the rest padding, read in place until the batch is collected), and each one's geometry (an
        ``(n, 11)`` int array, as the records carry it: per axis, rows then columns, the window's start and length,
        the length it is resized to, the offset and length of the output in that; then 1 to flip); returns the
        ticket to collect it with. ``capacity``: the most JPEGs a batch will hold (the loader's batch size), read at
        the first batch.

        Raises:
            DaliFailed: a batch larger than the first batch's ``capacity`` (nothing was handed over).
            ValueError: not one row, one length and one geometry per JPEG.
        """
        n = len(jpegs)
        if n == 0 or jpegs.ndim != 2 or len(lengths) != n or geometry.shape != (n, 11):
            raise ValueError(f"one row of bytes, one length and one geometry (11 ints) per JPEG: rows "
                             f"{jpegs.shape}, lengths {len(lengths)}, geometry {geometry.shape}")  # fmt: skip
        g = np.asarray(geometry, dtype=np.float64)
        scale = g[:, [1, 6]] / g[:, [2, 7]]  # window pixels per resized pixel, rows and columns
        start = g[:, [3, 8]] * scale
        end = start + g[:, [4, 9]] * scale
        flip = g[:, 10] != 0  # the columns' start and end swapped: DALI's resize flips the region
        start[flip, 1], end[flip, 1] = end[flip, 1], start[flip, 1]
        numbers = np.concatenate([np.asarray(lengths, np.float64).reshape(n, 1), g[:, [0, 5]], g[:, [1, 6]],
                                  g[:, [4, 9]], start, end], axis=1)  # fmt: skip
        return self._hand_over(n, capacity, {"jpegs": jpegs, "numbers": np.ascontiguousarray(numbers, np.float32)})

    def _hand_over(self, n: int, capacity: int, inputs: dict[str, np.ndarray]) -> int:
        """Queue a batch of ``n`` JPEGs whose pipeline inputs are ``inputs`` (by external source; ``"jpegs"`` is
        kept alive until the batch is collected) and feed the free pipelines; its ticket."""
        if not self._capacity:
            self._capacity = max(n, capacity)
        if n > self._capacity:
            raise DaliFailed(f"a batch of {n} JPEGs, more than the {self._capacity} the pipelines were built for")
        t0, built = time.perf_counter(), self.timings["build_s"]
        ticket = self._next
        self._next += 1
        self._waiting.append((ticket, inputs))
        self._feed()
        self.timings["submit_s"] += time.perf_counter() - t0 - (self.timings["build_s"] - built)
        return ticket

    def _feed(self) -> None:
        """Hand waiting batches to free pipelines, in order (ticket ``t`` goes to pipeline ``t % pipes``)."""
        while self._waiting:
            ticket, inputs = self._waiting[0]
            k = ticket % self.pipes
            if any(t % self.pipes == k for t in self._fed):
                return
            self._waiting.popleft()
            pipe = self._pipes[k] or self._primed(k, inputs)
            if self._copied[k] is not None:  # DALI may write where its last output was: the copy is done by now
                self._copied[k][1].synchronize()
                self._copied[k] = None
            t0 = time.perf_counter()
            for name, value in inputs.items():
                pipe.feed_input(name, value)
            t1 = time.perf_counter()
            pipe.schedule_run()
            self.timings["feed_s"] += t1 - t0
            self.timings["schedule_s"] += time.perf_counter() - t1
            self._fed[ticket] = inputs["jpegs"]  # DALI reads them in place (no_copy)

    def collect(self, ticket: int) -> torch.Tensor:
        """The batch's images: ``(n, H, W, 3)`` uint8 on the device. Ordered on the current CUDA stream.

        Raises:
            DaliFailed: DALI failed on the batch (its pipeline is built again for the next).
        """
        if ticket not in self._fed:
            self._feed()
        if ticket not in self._fed:
            raise ValueError(f"ticket {ticket} is not the next to collect")
        k = ticket % self.pipes
        pipe = self._pipes[k]
        try:
            t0 = time.perf_counter()
            # bound to our stream: DALI's GPU work is waited for there, not by this thread
            (out,) = pipe.share_outputs(self._stream) if self._stream is not None and self.bind_outputs else (
                pipe.share_outputs())  # fmt: skip
            t1 = time.perf_counter()
            images = self._to_torch(out.as_tensor(), k)
            pipe.release_outputs()
            self.timings["wait_s"] += t1 - t0
            self.timings["handover_s"] += time.perf_counter() - t1
            self.timings["batches"] += 1
        except Exception as e:
            log.debug("DALI failed on a batch: %s", e)
            shut_dali(self._pipes[k])
            self._pipes[k] = None  # a pipeline that raised is no longer valid
            raise DaliFailed(f"{type(e).__name__}: {e}") from e
        finally:
            self._fed.pop(ticket, None)
            self._feed()
        return images

    def _to_torch(self, dense: Any, k: int) -> torch.Tensor:
        """Pipeline ``k``'s dense output as a torch tensor, copied on our stream after DALI's work and ordered
        before the current stream's next work; the output is kept until the copy is done."""
        if self._stream is None:
            return torch.from_numpy(np.array(dense))
        from nvidia.dali.plugin.pytorch import feed_ndarray

        current = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._stream):  # the memory is our stream's: the copy waits for nothing else
            images = torch.empty(tuple(dense.shape()), dtype=torch.uint8, device=self.device)
            feed_ndarray(dense, images, cuda_stream=self._stream.cuda_stream)  # after DALI's work on it
            copied = torch.cuda.Event()
            copied.record(self._stream)
        self._copied[k] = (dense, copied)
        current.wait_event(copied)
        images.record_stream(current)  # not reused before the current stream's work on it is done
        return images

    @property
    def idle(self) -> bool:
        """Whether every batch handed over was collected."""
        return not self._fed and not self._waiting

    def close(self) -> None:
        """Drop the pipelines (their threads and memory) and whatever was in flight."""
        for held in self._copied:
            if held is not None:  # a copy out of DALI's buffer may still run
                held[1].synchronize()
        self._copied = [None] * self.pipes
        self._fed.clear()
        self._waiting.clear()
        for pipe in self._pipes:
            shut_dali(pipe)
        self._pipes = [None] * self.pipes
