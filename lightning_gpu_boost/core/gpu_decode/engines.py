"""The GPU's JPEG engines (the hardware decoders of A100, H100 and H200) through nvImageCodec, where it is installed.

nvJPEG through torchvision decodes on the GPU's multiprocessors, which the model's step also needs; the engines
decode beside them. :func:`open_engines` returns ``None`` (and says why) where nvImageCodec is missing or the GPU has
no engines: the GPU decode then uses nvJPEG through torchvision. A JPEG the engines refuse comes back as ``None``,
for the caller's next decoder. Framework-free.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from lightning_gpu_boost._imports import require

__all__ = ["JpegEngines", "code_stream", "open_engines"]

log = logging.getLogger(__name__)


class JpegEngines:
    """Decode JPEGs (CPU uint8 tensors of their bytes) to CHW uint8 RGB on ``device`` on the GPU's JPEG engines.

    Attributes:
        name: what decodes (for the run record).
    """

    name = "the GPU's JPEG engines (nvImageCodec)"

    def __init__(self, module: Any, device: torch.device) -> None:
        self._nic, self.device = module, device
        self._decoder = module.Decoder(device_id=device.index if device.index is not None else
                                       torch.cuda.current_device(),
                                       backends=[module.Backend(module.BackendKind.HW_GPU_ONLY)])  # fmt: skip
        self._params = module.DecodeParams(color_spec=module.ColorSpec.SRGB, sample_format=module.SampleFormat.P_RGB)

    def decode(self, jpegs: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """The images, on the current CUDA stream; ``None`` where the engines refused a JPEG."""
        streams = [code_stream(self._nic, t) for t in jpegs]
        stream = torch.cuda.current_stream(self.device).cuda_stream
        images = self._decoder.decode(streams, params=self._params, cuda_stream=stream)
        return [None if im is None else torch.as_tensor(im, device=self.device) for im in images]


def code_stream(module: Any, data: torch.Tensor) -> Any:
    """nvImageCodec's ``CodeStream`` of one JPEG's bytes (a CPU uint8 tensor): a view where the build takes one."""
    try:
        return module.CodeStream(data.numpy())
    except TypeError:  # a build that takes bytes only
        return module.CodeStream(data.numpy().tobytes())


def open_engines(device: torch.device) -> tuple[JpegEngines | None, str]:
    """The engines of ``device``'s GPU and ``""``, or ``None`` and why not."""
    if device.type != "cuda":
        return None, "not a CUDA device"
    try:
        nvimgcodec = require("nvidia.nvimgcodec")
    except ImportError as e:  # the message names the extra for this torch's CUDA
        return None, str(e)
    try:
        return JpegEngines(nvimgcodec, device), ""
    except Exception as e:
        log.debug("nvImageCodec's hardware decoder is unavailable: %s", e)
        return None, f"nvImageCodec has no hardware decoder here ({type(e).__name__}: {e})"
