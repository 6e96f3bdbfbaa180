"""DALI graphs from encoded bytes to the model's input: :func:`classification_graph` (decode, crop, flip, normalize) and
:func:`audio_graph` (decode, resample, pad)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from lightning_gpu_boost._imports import require
from lightning_gpu_boost.core.dali.sources import Dtype
from lightning_gpu_boost.core.images import IMAGENET_MEAN, IMAGENET_STD

__all__ = ['audio_graph', 'classification_graph']

def classification_graph(
    encoded: Any,
    *,
    train: bool,
    gpu: bool,
    image_size: int = 224,
    val_resize: int | None = None,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3 / 4, 4 / 3),
    flip: bool = True,
    normalize: tuple[Sequence[float], Sequence[float]] | None = (IMAGENET_MEAN, IMAGENET_STD),
    dtype: Dtype = "float32",
    channels_last: bool = False,
    hw_decoder_load: float = 0.65,
    decoder_options: dict[str, Any] | None = None,
    decoder_device: Literal["mixed", "cpu"] = "mixed",
) -> Any:
    """The image half of an ImageNet-style DALI pipeline. Training: decode with a random-resized crop (area
    ``scale``, aspect ``ratio``), resize to ``image_size``, random horizontal flip. Validation: decode, resize the
    shorter side to ``val_resize`` (default ``image_size / 0.875``), center crop. Both then normalize with
    ``(mean, std)`` on the 0-1 scale (``None``: keep 0-255) into ``dtype`` (``bfloat16`` leaves DALI as
    ``float16``; the loader converts it), layout ``CHW`` (``HWC`` with ``channels_last``). On the GPU
    (``gpu=True``) images are decoded by nvJPEG (``decoder_device="mixed"``, ``hw_decoder_load`` of them by the
    hardware decoder) or by DALI's CPU threads (``"cpu"``; the crop is decoded, then uploaded); resizing and
    normalizing run on the GPU either way. ``decoder_options`` go to the DALI decoder as they are."""
    dali = require("nvidia.dali")
    fn, types = dali.fn, dali.types
    if decoder_device not in ("mixed", "cpu"):
        raise ValueError(f"decoder_device must be 'mixed' or 'cpu', got {decoder_device!r}.")
    decode_device = "mixed" if gpu and decoder_device == "mixed" else "cpu"
    hw = {"hw_decoder_load": hw_decoder_load} if decode_device == "mixed" else {}
    hw.update(decoder_options or {})
    upload = gpu and decode_device == "cpu"  # CPU-decoded images go to the GPU for the rest
    if train:
        images = fn.decoders.image_random_crop(
            encoded, device=decode_device, output_type=types.RGB, random_area=list(scale),
            random_aspect_ratio=list(ratio), num_attempts=10, **hw,
        )  # fmt: skip
        resize = {"resize_x": image_size, "resize_y": image_size}
        mirror = fn.random.coin_flip(probability=0.5) if flip else 0
        crop = {}
    else:
        images = fn.decoders.image(encoded, device=decode_device, output_type=types.RGB, **hw)
        resize = {"resize_shorter": val_resize or round(image_size / 0.875)}
        mirror, crop = 0, {"crop": (image_size, image_size)}
    images = fn.resize(images.gpu() if upload else images, **resize)
    mean, std = normalize if normalize is not None else ((0.0,) * 3, (1 / 255,) * 3)
    out_type = {
        "float32": types.FLOAT,
        "float16": types.FLOAT16,
        "bfloat16": types.FLOAT16,
        "uint8": types.UINT8,
    }
    if dtype == "uint8" and normalize is not None:
        raise ValueError("dtype='uint8' keeps 0-255 pixels: pass normalize=None with it.")
    return fn.crop_mirror_normalize(
        images, dtype=out_type[dtype], output_layout="HWC" if channels_last else "CHW",
        mean=[255 * m for m in mean], std=[255 * s for s in std], mirror=mirror, **crop,
    )  # fmt: skip


def audio_graph(
    encoded: Any, *, gpu: bool, sample_rate: float | None = None, dtype: Literal["int16", "float32"] = "int16"
) -> tuple[Any, Any]:
    """Encoded audio files (WAV, FLAC, OGG: DALI's audio decoder, in its CPU threads) to ``(waveforms, lengths)``:
    each clip mono (channels averaged), at its own rate or resampled by DALI to ``sample_rate``, as ``int16`` PCM
    (half the bytes of float32) or ``float32`` in [-1, 1], zeros after each clip up to the batch's longest; on the
    GPU with ``gpu`` (padded there). A :class:`DALILoader` over it yields ``(waveforms N x T, lengths N, labels N)``,
    what :class:`~lightning_gpu_boost.core.gpu_transforms.LogMel` takes (e.g. as ``StreamPrefetch(transform=...)``).
    """
    dali = require("nvidia.dali")
    fn, types = dali.fn, dali.types
    if dtype not in ("int16", "float32"):
        raise ValueError(f"dtype must be 'int16' or 'float32', got {dtype!r}.")
    rate = {} if sample_rate is None else {"sample_rate": float(sample_rate)}
    audio, _ = fn.decoders.audio(encoded, dtype=types.INT16 if dtype == "int16" else types.FLOAT, downmix=True,
                                 **rate)  # fmt: skip
    lengths = fn.reshape(audio.shape(dtype=types.INT64), shape=[])
    if gpu:
        audio, lengths = audio.gpu(), lengths.gpu()
    return fn.pad(audio, fill_value=0), lengths
