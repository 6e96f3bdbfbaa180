"""The GPU's side of the GPU decode: a batch of records (:mod:`~lightning_gpu_boost.core.gpu_decode.plan`) becomes
the normalized float images the CPU transform would have made.

JPEGs are decoded together by nvJPEG (``torchvision.io.decode_jpeg`` on a list, on the GPU), each is cropped (a
view), resized (bilinear with antialiasing, as PIL does), flipped where drawn, rounded to 8-bit values as PIL's
images are, and written into one batch; the samples the workers decoded are copied in; the batch is normalized in
one pass. Without CUDA the same steps run on the CPU (libjpeg through torchvision, else PIL): the values a CPU run
gets. A JPEG nvJPEG refuses is decoded on the CPU.

Framework-free.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lightning_gpu_boost.core.gpu_decode.plan import JPEG_MAGIC, PIXELS_MAGIC, unpack

__all__ = ["BatchDecoder", "is_records"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_records(value: Any) -> bool:
    """Whether ``value`` is a batch's list of GPU-decode records."""
    return (isinstance(value, list) and bool(value) and isinstance(value[0], bytes)
            and value[0][:4] in (JPEG_MAGIC, PIXELS_MAGIC))  # fmt: skip


def _decode_on_cpu(data: Any) -> torch.Tensor:
    try:
        from torchvision.io import ImageReadMode, decode_jpeg

        return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    except ImportError:
        from PIL import Image

        with Image.open(io.BytesIO(bytes(data))) as img:
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

    Attributes:
        decoded_on_gpu, decoded_by_workers, decoded_on_cpu_here: sample counts so far (the last: JPEGs nvJPEG
            refused, or every JPEG on a CPU device).
        last_share: the share of the last batch's samples that the workers sent as JPEGs.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], device: torch.device | str = "cpu",
                 dtype: str = "float32", channels_last: bool = False, key: int = 0) -> None:  # fmt: skip
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}.")
        self.device = torch.device(device)
        self.dtype, self.channels_last, self.key = _DTYPES[dtype], channels_last, key
        std64 = torch.tensor(std, dtype=torch.float64)
        self._scale = (1.0 / (255.0 * std64)).float().view(1, -1, 1, 1).to(self.device)
        self._shift = (-torch.tensor(mean, dtype=torch.float64) / std64).float().view(1, -1, 1, 1).to(self.device)
        self.decoded_on_gpu = self.decoded_by_workers = self.decoded_on_cpu_here = 0
        self.last_share: float | None = None

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, (list, tuple)) and len(batch) > self.key and is_records(batch[self.key]):
            items = list(batch)
            items[self.key] = self.images(batch[self.key])
            return type(batch)(items) if not hasattr(batch, "_fields") else type(batch)(*items)
        return batch

    def images(self, records: list[bytes]) -> torch.Tensor:
        """The normalized images of one batch's records."""
        jpegs: list[tuple[int, Any, list]] = []
        pixels: list[tuple[int, np.ndarray]] = []
        for k, record in enumerate(records):
            kind, data, ops = unpack(record)
            if kind == "jpeg":
                jpegs.append((k, data, ops))
            else:
                pixels.append((k, data))
        self.last_share = len(jpegs) / len(records)
        shape = self._shape(jpegs, pixels)
        out = torch.empty((len(records), *shape), dtype=torch.float32, device=self.device)
        if pixels:
            stacked = torch.from_numpy(np.stack([p for _, p in pixels]))
            if self.device.type == "cuda":
                stacked = stacked.pin_memory().to(self.device, non_blocking=True)
            out[torch.tensor([k for k, _ in pixels], device=self.device)] = stacked.float()
            self.decoded_by_workers += len(pixels)
        if jpegs:
            for (k, _, ops), image in zip(jpegs, self._decode([d for _, d, _ in jpegs]), strict=True):
                out[k] = _apply(image, ops)
        out.round_().clamp_(0, 255)  # PIL's images hold 8-bit values
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        images = torch.empty(out.shape, dtype=self.dtype, device=self.device, memory_format=memory_format)
        return torch.addcmul(self._shift, out, self._scale, out=images)

    @staticmethod
    def _shape(jpegs: list, pixels: list) -> tuple[int, int, int]:
        if pixels:
            return tuple(pixels[0][1].shape)  # type: ignore[return-value]
        h = w = None
        for op in jpegs[0][2]:
            if op[0] in ("crop", "resize"):
                h, w = op[-2], op[-1]
        if h is None:
            raise ValueError("a GPU-decode record without a crop or resize: its size is unknown")
        return 3, h, w

    def _decode(self, datas: list[Any]) -> list[torch.Tensor]:
        if self.device.type != "cuda":
            self.decoded_on_cpu_here += len(datas)
            return [_decode_on_cpu(d) for d in datas]
        from torchvision.io import ImageReadMode, decode_jpeg

        sizes = [len(d) for d in datas]
        buffer = bytearray(sum(sizes))
        start = 0
        for d, n in zip(datas, sizes, strict=True):
            buffer[start: start + n] = d
            start += n
        flat = torch.frombuffer(buffer, dtype=torch.uint8)
        tensors, start = [], 0
        for n in sizes:
            tensors.append(flat[start: start + n])
            start += n
        try:
            images = decode_jpeg(tensors, device=self.device, mode=ImageReadMode.RGB)
            self.decoded_on_gpu += len(images)
            return images
        except RuntimeError:  # one JPEG nvJPEG refuses: each on its own, the refused ones on the CPU
            out = []
            for t, d in zip(tensors, datas, strict=True):
                try:
                    out.append(decode_jpeg(t, device=self.device, mode=ImageReadMode.RGB))
                    self.decoded_on_gpu += 1
                except RuntimeError:
                    out.append(_decode_on_cpu(d).to(self.device))
                    self.decoded_on_cpu_here += 1
            return out


def _apply(image: torch.Tensor, ops: list[tuple]) -> torch.Tensor:
    """One decoded CHW uint8 image through its operations: float, not yet rounded."""
    x = image
    for op in ops:
        if op[0] == "crop":
            _, i, j, h, w = op
            x = x[:, i: i + h, j: j + w]
        elif op[0] == "resize":
            _, h, w = op
            if tuple(x.shape[-2:]) != (h, w):
                x = torch.nn.functional.interpolate(x[None].float(), size=(h, w), mode="bilinear", antialias=True,
                                                    align_corners=False)[0]  # fmt: skip
        elif op[0] == "flip":
            x = x.flip(-1)
    return x
