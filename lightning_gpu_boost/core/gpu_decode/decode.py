"""The GPU's side of the GPU decode: a batch of records (:mod:`~lightning_gpu_boost.core.gpu_decode.plan`) becomes
the normalized float images the CPU transform would have made.

Where DALI is installed, the prefetcher hands each batch over when it fetches it (:meth:`BatchDecoder.begin`) and
takes the images when it hands the batch out (:meth:`BatchDecoder.end`): DALI pipelines decode each JPEG's crop
window, resize (linear, antialiased) and flip it meanwhile, in threads that do not need the training process's GIL
(:mod:`~lightning_gpu_boost.core.gpu_decode.dali_windows`). Otherwise JPEGs are decoded together on the GPU's JPEG
engines where nvImageCodec is installed (:mod:`~lightning_gpu_boost.core.gpu_decode.engines`), else by nvJPEG
(``torchvision.io.decode_jpeg`` on a list); each one's crop, resize (bilinear with antialiasing: PIL's weights) and
flip are one resampling per axis, done for the whole batch as two batched matrix products. Either way the images
hold 8-bit values as PIL's do; the samples the workers decoded are copied in; the batch is normalized in one pass.
Without CUDA the same steps run on the CPU (libjpeg through torchvision, else PIL): the values a CPU run gets. A JPEG
nvJPEG refuses is decoded on the CPU.

Framework-free.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lightning_gpu_boost.core.gpu_decode.dali_windows import DaliFailed, DaliWindows
from lightning_gpu_boost.core.gpu_decode.engines import open_engines
from lightning_gpu_boost.core.gpu_decode.plan import geometry
from lightning_gpu_boost.core.gpu_decode.records import RecordBatch

__all__ = ["BatchDecoder", "is_records"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_records(value: Any) -> bool:
    """Whether ``value`` is a batch's GPU-decode records."""
    return isinstance(value, RecordBatch)


def _decode_on_cpu(data: torch.Tensor) -> torch.Tensor:
    """One JPEG (a CPU uint8 tensor of its bytes) decoded to CHW uint8 RGB: libjpeg through torchvision, else PIL."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg

        return decode_jpeg(data.contiguous(), mode=ImageReadMode.RGB)
    except ImportError:
        from PIL import Image

        with Image.open(io.BytesIO(data.numpy().tobytes())) as img:
            array = np.asarray(img.convert("RGB"))
        return torch.from_numpy(array.copy()).permute(2, 0, 1)


class BatchDecoder:
    """Turn the records at ``key`` of each batch into ``(N, 3, H, W)`` normalized images on ``device``.

    Args:
        mean, std: the normalization, per channel in [0, 1] units.
        device: where to decode (``cuda``: nvJPEG; ``cpu``: libjpeg or PIL).
        dtype: the images' dtype (``"float32"``, ``"bfloat16"``, ``"float16"``).
        channels_last: return the images in ``channels_last`` memory format.
        key: the records' position in the batch (``(images, targets)``: 0).
        engines: decode on the GPU's JPEG engines where nvImageCodec has them (else, or ``False``: nvJPEG).
        dali: decode through DALI pipelines between :meth:`begin` and :meth:`end` where DALI is installed.

    Attributes:
        decoded_on_gpu, decoded_by_workers, decoded_on_cpu_here: sample counts so far (the last: JPEGs nvJPEG
            refused, or every JPEG on a CPU device).
        decoder_name: what decodes the JPEGs on the GPU (the JPEG engines or nvJPEG, and why not the engines).
        last_share: the GPU share the last batch's samples were made under (where its records say), else the share
            of its samples the workers sent as JPEGs.
        last_made_at, last_made_by: when its worker collated the last batch (``time.monotonic()``) and which
            worker (``-1``: the training process), where its records say.
        last_engine_load: the share for the JPEG engines of the DALI pipelines that decoded the last batch
            (``None``: DALI did not decode it).
        engine_load: the share of each batch for the JPEG engines in the DALI pipelines the next batch is handed
            to (DALI's ``hw_decoder_load``; the rest: nvJPEG's CUDA decoder; ``None``: DALI pipelines' default, all).
            Set from any thread: the next :meth:`begin` builds pipelines for it; batches already handed over are
            collected from theirs.
    """

    #: a mixed batch (workers' pixels and JPEGs) gathered in the layout it is normalized into (channels-last, DALI's
    #: own) instead of a contiguous one: the same values; off until a GPU measures it (``benchmarks/gpu_decode.py``'s
    #: ``*_layout`` variants)
    _gather_in_layout = False

    def __init__(self, mean: Sequence[float], std: Sequence[float], device: torch.device | str = "cpu",
                 dtype: str = "float32", channels_last: bool = False, key: int = 0, engines: bool = True,
                 dali: bool = True) -> None:  # fmt: skip
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}.")
        for name, value in (("engines", engines), ("dali", dali)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}.")
        self.device = torch.device(device)
        self.dtype, self.channels_last, self.key = _DTYPES[dtype], channels_last, key
        std64 = torch.tensor(std, dtype=torch.float64)
        self._scale = (1.0 / (255.0 * std64)).float().view(1, -1, 1, 1).to(self.device)
        self._shift = (-torch.tensor(mean, dtype=torch.float64) / std64).float().view(1, -1, 1, 1).to(self.device)
        self.decoded_on_gpu = self.decoded_by_workers = self.decoded_on_cpu_here = 0
        self.last_share: float | None = None  # None: the last batch's samples were made under several shares
        self.last_made_at: float | None = None  # when its worker collated the last batch (time.monotonic())
        self.last_made_by: int | None = None
        self.handed_out: tuple | None = None  # the last_* of the batch handed to the step, where a thread decodes ahead
        self._engines: Any = None if engines else False  # None: not opened yet; False: none here, or not wanted
        self.decoder_name = "not used yet" if engines else "nvJPEG (torchvision): engines=False"
        self._dali: Any = None if dali else False  # None: not opened yet; False: not installed, or not wanted
        self.dali_failures = 0  # batches DALI failed on (decoded another way)
        self.dali_unavailable = "" if dali else "dali=False"
        self.engine_load: float | None = None
        self.last_engine_load: float | None = None
        self._retired: list[DaliWindows] = []  # pipelines of another engine load, until their batches are collected

    @property
    def asynchronous(self) -> bool:
        """Whether :meth:`begin` hands batches to DALI (opened here at the first call)."""
        if self._dali is None:
            try:
                load = {} if self.engine_load is None else {"hw_decoder_load": self.engine_load}
                self._dali = DaliWindows(self.device, **load)
            except ImportError as e:  # DALI is not installed: the message names its extra
                self._dali, self.dali_unavailable = False, str(e)
        return bool(self._dali)

    @property
    def ahead(self) -> int:
        """How many batches to hand over before taking the first: one per DALI pipeline (else 1)."""
        return self._dali.pipes if self.asynchronous else 1

    def begin(self, batch: Any) -> Any:
        """Hand the batch's JPEGs to DALI, if :attr:`asynchronous`; the token :meth:`end` takes. Call :meth:`end`
        for every token, in order."""
        records = batch[self.key] if isinstance(batch, (list, tuple)) and len(batch) > self.key else None
        if not is_records(records) or not records.jpeg_index or records.geometry is None or not self.asynchronous:
            return batch, None
        if self.engine_load is not None and self._dali.hw_decoder_load != self.engine_load:
            # new pipelines; the old ones finish their batches
            self._retired.append(self._dali)
            self._dali = DaliWindows(self.device, hw_decoder_load=self.engine_load)
        try:
            ticket = self._submit(records)
        except DaliFailed:
            return batch, None
        return batch, (self._dali, ticket)

    def _submit(self, records: RecordBatch) -> int:
        """Hand the records' JPEGs and geometry to DALI (it decodes, resizes and flips them); the ticket."""
        return self._dali.submit(records.jpeg.numpy(), np.asarray(records.lengths), np.asarray(records.geometry),
                                 capacity=records.size)  # fmt: skip

    def _collect(self, windows: DaliWindows, ticket: int) -> torch.Tensor:
        """The images of ``ticket`` from the pipelines it was handed to; retired pipelines are closed once their
        last batch is collected."""
        try:
            return windows.collect(ticket)
        finally:
            if windows is not self._dali and windows.idle:
                windows.close()
                self._retired = [w for w in self._retired if w is not windows]

    def end(self, token: Any) -> Any:
        """The batch of a :meth:`begin` token with its images decoded (as :meth:`__call__` returns it)."""
        batch, ticket = token
        self.last_engine_load = None
        if ticket is None:
            return self(batch)
        records = batch[self.key]
        windows = ticket[0]
        try:
            images = self._collect(*ticket)  # (n, H, W, 3) uint8: decoded, resized and flipped
        except DaliFailed:
            self.dali_failures += 1
            return self(batch)
        self.decoded_on_gpu += len(records.jpeg_index)
        self.last_engine_load = windows.hw_decoder_load
        if self.device.type == "cuda":
            self.decoder_name = _dali_name(windows.hw_decoder_load)
        return self._with_images(batch, self._assemble(records, lambda shape: images.permute(0, 3, 1, 2)))

    def discard(self, token: Any) -> None:
        """Drop a :meth:`begin` token's batch (a loop stopped before handing it out; after :meth:`close`, nothing is
        left to drop)."""
        if token[1] is not None and (token[1][0] is self._dali or token[1][0] in self._retired):
            try:
                self._collect(*token[1])
            except DaliFailed:
                pass

    def close(self) -> None:
        """Drop DALI's pipelines (their threads and memory)."""
        for windows in self._retired:
            windows.close()
        self._retired = []
        if self._dali:
            self._dali.close()
            self._dali = None

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, (list, tuple)) and len(batch) > self.key and is_records(batch[self.key]):
            return self._with_images(batch, self.images(batch[self.key]))
        return batch

    def _with_images(self, batch: Any, images: torch.Tensor) -> Any:
        """``batch`` (a list, tuple or named tuple) with ``images`` in place of its records."""
        items = list(batch)
        items[self.key] = images
        return type(batch)(items) if not hasattr(batch, "_fields") else type(batch)(*items)

    def images(self, records: RecordBatch) -> torch.Tensor:
        """The normalized images of one batch's records."""
        return self._assemble(records, lambda shape: self._resample(self._decode(records.jpegs()), records.ops,
                                                                    shape))  # fmt: skip

    def _assemble(self, records: RecordBatch, jpeg_images: Any) -> torch.Tensor:
        """The batch's normalized images: the workers' pixels and ``jpeg_images(shape)`` (the JPEGs' images: uint8,
        or float from the batched resampling) at their positions, as 8-bit values (PIL's images hold those),
        normalized in one pass that reads the 8-bit values."""
        self.last_made_at, self.last_made_by = records.made_at, records.made_by
        # the share its workers were set to (the placement's search), else the share of JPEGs in it
        share = records.share
        if share is None:
            self.last_share = len(records.jpeg_index) / max(1, records.size)
        else:
            self.last_share = None if math.isnan(share) else share
        shape = self._shape(records)
        jpegs = _eight_bit(jpeg_images(shape[1:])) if records.jpeg_index else None
        if records.pixels is None and len(records.jpeg_index) == records.size:  # every sample a JPEG, in order
            out = jpegs
        else:
            gather = torch.channels_last if self._gather_in_layout and self.channels_last else torch.contiguous_format
            out = torch.empty((records.size, *shape), dtype=torch.uint8, device=self.device, memory_format=gather)
            if records.pixels is not None:
                pixels = records.pixels.to(self.device, non_blocking=True)
                out[self._to_device(torch.tensor(records.pixel_index))] = pixels
                self.decoded_by_workers += len(records.pixel_index)
            if jpegs is not None:
                out[self._to_device(torch.tensor(records.jpeg_index))] = jpegs
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        images = torch.empty(out.shape, dtype=self.dtype, device=self.device, memory_format=memory_format)
        return torch.addcmul(self._shift, out, self._scale, out=images)  # the 8-bit values promoted in the kernel

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A small CPU tensor on the device without waiting for the stream (pinned, then copied asynchronously)."""
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def _resample(self, images: list[torch.Tensor], ops: list[list[tuple]], size: tuple[int, int]) -> torch.Tensor:
        """Each image's crop, resize and flip as two batched matrix products (rows, then columns): the window
        of each image is copied into one batch, and each output pixel is the PIL weights' sum over it."""
        shapes = [geometry(int(img.shape[-2]), int(img.shape[-1]), o) for img, o in zip(images, ops, strict=True)]
        if any(g is None for g in shapes):
            raise ValueError("a GPU-decode record whose operations are not one crop, resize, crop and flip")
        rows = torch.tensor([g[0][:4] for g in shapes], dtype=torch.float32)  # type: ignore[index]
        cols = torch.tensor([g[1][:4] for g in shapes], dtype=torch.float32)  # type: ignore[index]
        flips = torch.tensor([g[2] for g in shapes], dtype=torch.bool)  # type: ignore[index]
        tall, wide = int(rows[:, 1].max()), int(cols[:, 1].max())
        windows = torch.empty((len(images), 3, tall, wide), dtype=torch.uint8, device=self.device)
        pairs = [(windows[k, :, : r[1], : c[1]], img[:, r[0]: r[0] + r[1], c[0]: c[0] + c[1]])
                 for k, (img, (r, c, _)) in enumerate(zip(images, shapes, strict=True))]  # type: ignore[misc]  # fmt: skip
        torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])  # one call for the batch's windows
        return self._products(windows, *(self._to_device(t) for t in (rows, cols, flips)), size)

    def _products(self, windows: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, flips: torch.Tensor,
                  size: tuple[int, int]) -> torch.Tensor:  # fmt: skip
        """The two batched products; ``rows``/``cols``: ``(length, resized, offset)`` per sample (or with the start
        first: the last three columns are read)."""
        rows, cols = rows[:, -3:], cols[:, -3:]
        tall, wide = int(windows.shape[-2]), int(windows.shape[-1])
        # half precision holds every 8-bit value exactly and the products accumulate in float32; on a CPU, float32
        precision = torch.float16 if self.device.type == "cuda" else torch.float32
        wy = _axis_weights(rows[:, 0], rows[:, 1], rows[:, 2], size[0], tall).to(precision)
        wx = _axis_weights(cols[:, 0], cols[:, 1], cols[:, 2], size[1], wide, flips).to(precision)
        tall_out = torch.matmul(wy[:, None], windows.to(precision))  # (n, 3, out_h, wide)
        return torch.matmul(tall_out, wx[:, None].transpose(-1, -2))  # (n, 3, out_h, out_w)

    @staticmethod
    def _shape(records: RecordBatch) -> tuple[int, int, int]:
        if records.pixels is not None:
            return tuple(records.pixels.shape[1:])  # type: ignore[return-value]
        h = w = None
        for op in records.ops[0]:
            if op[0] in ("crop", "resize"):
                h, w = op[-2], op[-1]
        if h is None:
            raise ValueError("a GPU-decode record without a crop or resize: its size is unknown")
        return 3, h, w

    def _decode(self, jpegs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each JPEG (a CPU uint8 tensor of its bytes) decoded to CHW uint8 RGB on the device: the JPEG engines for
        the batch where there are any, else nvJPEG; a JPEG the engines refuse, by nvJPEG; one nvJPEG refuses, on the
        CPU."""
        if self.device.type != "cuda":
            self.decoded_on_cpu_here += len(jpegs)
            return [_decode_on_cpu(d) for d in jpegs]
        if self._engines is None:
            self._engines, why = open_engines(self.device)
            self.decoder_name = self._engines.name if self._engines else f"nvJPEG (torchvision): {why}"
        if self._engines:
            images = self._engines.decode(jpegs)
            refused = [k for k, im in enumerate(images) if im is None]
            self.decoded_on_gpu += len(images) - len(refused)
            if len(refused) == len(images):  # none decoded: engines this GPU lacks; nvJPEG from now on
                self._engines = False
                self.decoder_name = "nvJPEG (torchvision): the JPEG engines decoded none of a batch"
            for k, im in zip(refused, self._nvjpeg([jpegs[k] for k in refused]), strict=True):
                images[k] = im
            return images  # type: ignore[return-value]
        return self._nvjpeg(jpegs)

    def _nvjpeg(self, jpegs: list[torch.Tensor]) -> list[torch.Tensor]:
        if not jpegs:
            return []
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            images = decode_jpeg(jpegs, device=self.device, mode=ImageReadMode.RGB)
            self.decoded_on_gpu += len(images)
            return images
        except RuntimeError:  # a JPEG nvJPEG refuses: each on its own, the refused ones on the CPU
            out = []
            for t in jpegs:
                try:
                    out.append(decode_jpeg(t, device=self.device, mode=ImageReadMode.RGB))
                    self.decoded_on_gpu += 1
                except RuntimeError:
                    out.append(_decode_on_cpu(t).to(self.device))
                    self.decoded_on_cpu_here += 1
            return out


def _dali_name(engine_load: float) -> str:
    """What decodes in DALI's pipelines at ``engine_load``."""
    what = ("the JPEG engines" if engine_load >= 1.0 else "nvJPEG's CUDA decoder" if engine_load <= 0.0
            else "the JPEG engines and nvJPEG's CUDA decoder")  # fmt: skip
    return f"DALI ({what}, in DALI's own threads)"


def _eight_bit(images: torch.Tensor) -> torch.Tensor:
    """``images`` as 8-bit values: uint8 as they are; float rounded and clamped to ``[0, 255]``, as PIL's are."""
    if images.dtype == torch.uint8:
        return images
    return images.round_().clamp_(0, 255).to(torch.uint8)


def _axis_weights(length: torch.Tensor, resized: torch.Tensor, offset: torch.Tensor, out: int, longest: int,
                  flip: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``(n, out, longest)`` resampling weights per sample, as PIL computes them for a bilinear resize with
    antialiasing: the triangle filter widened by the scale where it shrinks, over the window's ``length`` pixels,
    normalized; the output's first pixel is the resized window's ``offset``; rows reversed where ``flip``."""
    scale = length / resized
    support = scale.clamp(min=1.0)
    o = torch.arange(out, device=length.device, dtype=torch.float32).expand(len(length), out)
    if flip is not None:  # a flipped sample's output pixel o is the unflipped one's out - 1 - o: its rows, reversed
        o = torch.where(flip[:, None], (out - 1) - o, o)
    center = (o + offset[:, None] + 0.5) * scale[:, None]
    x = torch.arange(longest, device=length.device, dtype=torch.float32) + 0.5
    w = (1.0 - (x[None, None, :] - center[:, :, None]).abs() / support[:, None, None]).clamp_(min=0.0)
    w *= x[None, None, :] < length[:, None, None]
    w /= w.sum(-1, keepdim=True).clamp_(min=1e-12)
    return w

