"""Batch transforms for the common cases, meant for ``StreamPrefetch(transform=...)``: they run on whatever device
the batch is on (the GPU there), per batch, with per-sample random parameters drawn from torch's generators (which
the prefetcher seeds per rank, epoch and batch).

- :class:`RandomResizedCropFlip`: variable-size uint8 images (padded by :func:`pad_collate` in the workers, which
  only decode) -> a random-resized crop and a horizontal flip per sample, one ``grid_sample`` for the batch.
- :class:`JointAugment`: image + mask pairs -> the same rotation, scale and flip for both (bilinear for the image,
  nearest for the mask) and a colour jitter of the image, per sample.
- :class:`LogMel`: padded waveforms with their lengths -> resampled, 80-band log-mel features with frame lengths.

Plain torch (``affine_grid``, ``grid_sample``, ``torch.stft``): no extra dependency; kornia and
``torchvision.transforms.v2`` work in the same place where a pipeline needs more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from lightning_gpu_boost import _checks as checks

__all__ = ['CROP_ATTEMPTS', 'JointAugment', 'LogMel', 'MIP_LEVELS', 'RandomResizedCropFlip', 'pad_collate']


def pad_collate(samples: Sequence[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A ``collate_fn`` for variable-size uint8 CHW images: ``(images, sizes, labels)`` with the images padded
    (bottom and right, zeros) to the batch's largest height and width, ``sizes`` their ``(height, width)``.

    The batch keeps the images' memory layout: images decoded as HWC arrays and handed over as their CHW view
    (``torch.from_numpy(hwc).permute(2, 0, 1)``) make a channels-last batch (``N x C x H x W`` in shape, its bytes
    in ``N x H x W x C`` order), filled row by row instead of transposed pixel by pixel (0.29 against 0.41 ms per
    500 x 375 image on one core); the GPU transforms read either layout. In a DataLoader worker the batch is made
    in shared memory, as ``default_collate`` makes its batches, so that it is not copied again on its way to the
    main process (another 0.39 ms per such image)."""
    images, labels = zip(*samples, strict=True)
    c = images[0].shape[0]
    h = max(int(x.shape[-2]) for x in images)
    w = max(int(x.shape[-1]) for x in images)
    channels_last = all(x.dim() == 3 and x.stride(0) == 1 and c > 1 for x in images)
    shape = (len(images), h, w, c) if channels_last else (len(images), c, h, w)
    numel = math.prod(shape)
    if torch.utils.data.get_worker_info() is not None:
        storage = images[0].untyped_storage()._new_shared(numel * images[0].element_size())
        out = images[0].new_empty(0).set_(storage).view(shape).zero_()
    else:
        out = torch.zeros(shape, dtype=images[0].dtype)
    if channels_last:
        out = out.permute(0, 3, 1, 2)
    for k, x in enumerate(images):
        out[k, :, : x.shape[-2], : x.shape[-1]] = x
    sizes = torch.tensor([[x.shape[-2], x.shape[-1]] for x in images], dtype=torch.int64)
    return out, sizes, torch.as_tensor(labels)


#: box-filtered levels (2x, 4x) RandomResizedCropFlip(antialias=True) reads shrunk crops from
MIP_LEVELS = 2
#: draws of a crop box per sample before RandomResizedCropFlip falls back (torchvision's RandomResizedCrop: 10)
CROP_ATTEMPTS = 10


class RandomResizedCropFlip:
    """``(images uint8 N x C x H x W padded, sizes N x 2, labels)`` -> ``(float images N x C x size x size in [0, 1]
    (or normalized), labels)``: per sample, a crop of ``scale`` of the image's own area with an aspect ratio in
    ``ratio`` (torchvision's RandomResizedCrop rule: up to 10 draws, then the whole image at the nearest allowed
    aspect ratio), resized bilinearly to ``size`` and flipped horizontally with probability 0.5.

    Args:
        size: output side in pixels, ``>= 1``.
        scale: ``(min, max)`` share of the image's area, in ``(0, 1]``.
        ratio: ``(min, max)`` aspect ratio, ``> 0``.
        flip: flip horizontally with probability 0.5.
        normalize: ``(mean, std)`` per channel in [0, 1] units, applied after the crop; ``None``: [0, 1] floats.
        dtype: ``torch.float32`` or a lower precision for the output.
        antialias: shrink without aliasing, as Pillow's and torchvision's antialiased resize do: each sample is
            read from the batch's 2x- and 4x-box-filtered copies, blended by its crop's shrink (trilinear
            mipmapping: one ``grid_sample`` per level for the whole batch, no per-sample loop, no host sync).
            ``False``: plain bilinear sampling of the full image, whose pixel noise survives a large shrink.

    Raises:
        ValueError: a bad ``size``, ``scale``, ``ratio`` or ``normalize``.
    """

    def __init__(
        self,
        size: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: bool = True,
        normalize: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
        dtype: torch.dtype = torch.float32,
        antialias: bool = True,
    ) -> None:
        checks.check_int("size", size, low=1)
        checks.check_bool("antialias", antialias)
        self.antialias = antialias
        checks.check_pair("scale", scale, low=0.0, high=1.0)
        checks.check_pair("ratio", ratio, low=0.0)
        checks.check_bool("flip", flip)
        checks.check_normalize("normalize", normalize)
        self.size, self.scale, self.ratio, self.flip, self.normalize, self.dtype = (
            size, scale, ratio, flip, normalize, dtype,
        )  # fmt: skip
        self._stats: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def boxes(self, sizes: torch.Tensor) -> torch.Tensor:
        """Per sample ``(top, left, height, width)`` of its crop, in pixels of its own image: torchvision's
        ``RandomResizedCrop.get_params`` for every sample at once (up to :data:`CROP_ATTEMPTS` draws, the first that
        fits is taken; if none fits, the whole image cropped to the nearest allowed aspect ratio, centred)."""
        n, device, tries = sizes.shape[0], sizes.device, CROP_ATTEMPTS
        h, w = sizes[:, 0].float(), sizes[:, 1].float()
        area = (h * w)[:, None] * torch.empty(n, tries, device=device).uniform_(*self.scale)
        aspect = torch.exp(torch.empty(n, tries, device=device).uniform_(math.log(self.ratio[0]), math.log(self.ratio[1])))
        cw, ch = torch.sqrt(area * aspect).round(), torch.sqrt(area / aspect).round()
        ok = (cw <= w[:, None]) & (ch <= h[:, None]) & (cw > 0) & (ch > 0)
        first = ok.to(torch.uint8).argmax(1, keepdim=True)  # the first draw that fits (0 where none does)
        cw, ch, fits = cw.gather(1, first)[:, 0], ch.gather(1, first)[:, 0], ok.any(1)
        # torchvision's fallback: the whole image where its aspect ratio is allowed, else its widest allowed part
        in_ratio, low, high = w / h, min(self.ratio), max(self.ratio)
        fw = torch.where(in_ratio > high, (h * high).round(), w)
        fh = torch.where(in_ratio < low, (w / low).round(), h)
        cw, ch = torch.where(fits, cw, fw), torch.where(fits, ch, fh)
        top = ((h - ch + 1) * torch.rand(n, device=device)).floor().clamp(max=h - ch)  # randint(0, h - ch + 1)
        left = ((w - cw + 1) * torch.rand(n, device=device)).floor().clamp(max=w - cw)
        top = torch.where(fits, top, torch.div(h - ch, 2, rounding_mode="floor"))
        left = torch.where(fits, left, torch.div(w - cw, 2, rounding_mode="floor"))
        return torch.stack([top, left, ch, cw], 1)

    def __call__(self, batch: Any) -> Any:
        images, sizes, *rest = batch
        n, _, hp, wp = images.shape
        box = self.boxes(sizes.to(images.device))
        top, left, ch, cw = box.unbind(1)
        # affine_grid maps output [-1, 1] to input [-1, 1] of the padded image (align_corners=False)
        sx, sy = cw / wp, ch / hp
        tx, ty = (2 * left + cw) / wp - 1, (2 * top + ch) / hp - 1
        if self.flip:
            sx = torch.where(torch.rand(n, device=images.device) < 0.5, -sx, sx)
        theta = torch.zeros(n, 2, 3, device=images.device)
        theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = sx, tx, sy, ty
        grid = F.affine_grid(theta, [n, images.shape[1], self.size, self.size], align_corners=False)
        if self.antialias:  # the padding repeats each image's edge, so that no filtered level mixes it in
            c, dev = images.shape[1], images.device
            hs, ws = sizes[:, 0].to(dev), sizes[:, 1].to(dev)
            rows = torch.minimum(torch.arange(hp, device=dev)[None], (hs - 1)[:, None])
            cols = torch.minimum(torch.arange(wp, device=dev)[None], (ws - 1)[:, None])
            images = images.gather(2, rows[:, None, :, None].expand(-1, c, -1, wp))
            images = images.gather(3, cols[:, None, None, :].expand(-1, c, hp, -1))
        x = images.float() / 255
        out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
        if self.antialias:
            # trilinear mipmapping: a crop shrunk by s reads level log2(s) of 2x box-filtered copies, blended
            # between the two nearest levels (every level for every sample: no host sync on the side stream)
            shrink = torch.maximum(ch, cw) / self.size
            lv = torch.log2(shrink.clamp(min=1.0)).clamp(max=float(MIP_LEVELS)).view(-1, 1, 1, 1)
            out = out * (1 - lv).clamp(min=0)
            for k in range(1, MIP_LEVELS + 1):
                x = F.avg_pool2d(x, 2, ceil_mode=True)
                level = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
                out = out + level * (1 - (lv - k).abs()).clamp(min=0)
        if self.normalize is not None:
            if out.device not in self._stats:  # made once per device, not per batch
                self._stats[out.device] = tuple(
                    torch.tensor(v, device=out.device).view(1, -1, 1, 1) for v in self.normalize
                )
            mean, std = self._stats[out.device]
            out = (out - mean) / std
        return (out.to(self.dtype), *rest)


class JointAugment:
    """``(images N x C x H x W, masks N x H x W integer, *rest)`` -> the same random rotation (``degrees``), scale
    and horizontal flip for each image and its mask (bilinear for the image, nearest for the mask; outside the image:
    0 and ``ignore_index``), then brightness, contrast and saturation jitter of the image, all per sample. uint8
    images come out as floats in [0, 1].

    Args:
        degrees: rotation range ``(-degrees, degrees)``, ``>= 0``.
        scale: ``(min, max)`` zoom, ``> 0``.
        flip: flip horizontally with probability 0.5.
        jitter: brightness, contrast and saturation factors drawn in ``(1 - jitter, 1 + jitter)``, in ``[0, 1)``.
        ignore_index: the mask value where the warp leaves the image.
        size: output side in pixels: each sample's window of ``size x size`` input pixels at a random place
            (about whose centre it is rotated, zoomed and flipped), the whole image where ``None``.
        elastic: an elastic warp on top, the same for image and mask: a smooth random displacement field (an
            8 x 8 grid of normal draws with this standard deviation, in units of the output's half side,
            upsampled bicubically), ``>= 0``; 0 turns it off.

    Raises:
        ValueError: a bad ``degrees``, ``scale``, ``jitter``, ``ignore_index``, ``size`` or ``elastic``.
    """

    def __init__(
        self,
        degrees: float = 30.0,
        scale: tuple[float, float] = (0.8, 1.2),
        flip: bool = True,
        jitter: float = 0.3,
        ignore_index: int = 255,
        size: int | None = None,
        elastic: float = 0.0,
    ) -> None:
        checks.check_number("degrees", degrees, low=0.0)
        checks.check_int("size", size, low=1, allow_none=True)
        checks.check_number("elastic", elastic, low=0.0)
        self.size, self.elastic = size, elastic
        checks.check_pair("scale", scale, low=0.0)
        checks.check_int("ignore_index", ignore_index, low=0)
        checks.check_bool("flip", flip)
        checks.check_number("jitter", jitter, low=0.0, high=1.0, high_open=True)
        self.degrees, self.scale, self.flip, self.jitter, self.ignore_index = degrees, scale, flip, jitter, ignore_index

    def __call__(self, batch: Any) -> Any:
        images, masks, *rest = batch
        n, device = images.shape[0], images.device
        h, w = images.shape[-2:]
        out_h, out_w = (h, w) if self.size is None else (self.size, self.size)
        if out_h > h or out_w > w:
            raise ValueError(f"JointAugment(size={self.size}) needs images at least that large, got {h} x {w}.")
        # every per-sample draw in one call: few kernels, for the stage shares the GPU with the step it hides behind
        u = torch.rand(n, 8, device=device)
        angle = (u[:, 0] * 2 - 1) * (self.degrees * math.pi / 180)
        zoom = self.scale[0] + u[:, 1] * (self.scale[1] - self.scale[0])
        flip = torch.where(u[:, 2] < 0.5, -1.0, 1.0) if self.flip else torch.ones_like(zoom)
        cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
        # the window's half sides and centre in the input's [-1, 1] coordinates (the centre drawn per sample)
        sx, sy = out_w / w, out_h / h
        cx, cy = (u[:, 3] * 2 - 1) * (1 - sx), (u[:, 4] * 2 - 1) * (1 - sy)
        theta = torch.stack((sx * cos * flip, -sx * sin, cx, sy * sin * flip, sy * cos, cy), dim=1).view(n, 2, 3)
        grid = _warp_grid(theta, self.elastic, (sx, sy), out_h, out_w)
        # the image sampled as it comes (uint8 -> float once; the 1/255 is applied with the jitter, on the output)
        x = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        k = 1 / 255 if images.dtype == torch.uint8 else 1.0
        # the mask, nearest, shifted by one so that 0 marks where the window left the image (ignore_index there)
        shifted = masks[:, None] + 1.0  # a float scalar: computed in float32 (uint8 255 + 1 does not wrap)
        m = F.grid_sample(shifted, grid, mode="nearest", padding_mode="zeros", align_corners=False)[:, 0]
        m = torch.where(m > 0, m - 1, float(self.ignore_index)).to(masks.dtype)
        if self.jitter:
            j = self.jitter
            b, c, s = (1 - j + 2 * j * u[:, 5:8]).view(n, 3, 1, 1, 1).unbind(1)
            # brightness b, then contrast c around the brightened mean, then saturation s towards each pixel's grey
            # (grey is linear in the pixel): s*k*b*c * x + (1-s)*k*b*c * grey(x) + k*b*(1-c) * mean, in two passes
            mean = x.mean(dim=(1, 2, 3), keepdim=True)
            shift, kbc = mean * (k * b * (1 - c)), (k * b) * c
            if x.shape[1] == 3:
                gray = torch.mul(x[:, :1], 0.299).add_(x[:, 1:2], alpha=0.587).add_(x[:, 2:3], alpha=0.114)
                x = torch.addcmul(torch.addcmul(shift, gray, kbc * (1 - s)), x, kbc * s)
            else:
                x = torch.addcmul(shift, x, kbc)
            x = x.clamp_(0, 1)
        elif k != 1.0:
            x = x.mul_(k)
        return (x, m, *rest)


_WARP_BASES: dict[tuple[int, int, str], tuple[torch.Tensor, torch.Tensor]] = {}


def _warp_bases(out_h: int, out_w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows H x 10, cols W x 10)``: the 8-point bicubic upsampling weights (``F.interpolate(mode="bicubic",
    align_corners=False)``, separable) beside the affine terms: rows ``[.., 1, y]``, columns ``[.., x, 1]`` with
    ``x, y`` the output pixels' centres in [-1, 1] (``F.affine_grid(align_corners=False)``'s base grid)."""
    key = (out_h, out_w, str(device))
    if key not in _WARP_BASES:
        def side(size: int, affine_first: bool) -> torch.Tensor:
            eye = torch.eye(8, dtype=torch.float64).view(8, 1, 8, 1)
            cubic = F.interpolate(eye, size=(size, 1), mode="bicubic", align_corners=False).view(8, size).T
            centres = (torch.arange(size, dtype=torch.float64) * 2 + 1) / size - 1
            ones = torch.ones(size, dtype=torch.float64)
            extra = (ones, centres) if affine_first else (centres, ones)
            return torch.cat((cubic, torch.stack(extra, dim=1)), dim=1).float().to(device)

        _WARP_BASES[key] = (side(out_h, True), side(out_w, False))
    return _WARP_BASES[key]


def _warp_grid(theta: torch.Tensor, elastic: float, half: tuple[float, float], out_h: int, out_w: int) -> torch.Tensor:
    """The sampling grid (``N x H x W x 2``, a view) of ``F.affine_grid(theta)`` plus a smooth displacement: an 8 x 8
    grid of normal draws (standard deviation ``elastic`` times the window's half sides ``half``) upsampled
    bicubically; both at once as ``rows @ coefficients @ cols.T`` per sample and coordinate (two small batched
    matrix products: no base grid, no full-size upsampling and no sum over the grid)."""
    n, device = theta.shape[0], theta.device
    coef = torch.zeros(n, 2, 10, 10, device=device)
    if elastic:
        coef[:, 0, :8, :8].normal_(0.0, elastic * half[0])
        coef[:, 1, :8, :8].normal_(0.0, elastic * half[1])
    coef[:, :, 8, 8], coef[:, :, 9, 9], coef[:, :, 8, 9] = theta[:, :, 0], theta[:, :, 1], theta[:, :, 2]
    rows, cols = _warp_bases(out_h, out_w, device)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # TF32 would move sampling points by a fraction of a pixel
    try:
        out = torch.matmul(torch.matmul(rows, coef), cols.T)
    finally:
        torch.set_float32_matmul_precision(precision)
    return out.permute(0, 2, 3, 1)


class LogMel:
    """``(waveforms N x T, lengths N, *rest)`` -> ``(features N x frames x n_mels, frame lengths, *rest)``:
    linear resampling from ``source_rate`` to ``rate``, a Hann-window STFT, an ``n_mels`` triangular mel filterbank
    and ``log(x + 1e-6)``, for the whole batch at once.

    Waveforms are floats in [-1, 1] or integer PCM (``int16``: what a WAV file holds, half the bytes of float32 to
    pickle out of the workers, pin and copy), scaled to [-1, 1) on the device.

    Args:
        source_rate: the waveforms' sample rate, ``>= 1``.
        rate: the rate the features are computed at, ``>= 1``.
        n_fft: STFT size, ``>= 2``.
        hop: STFT hop, ``>= 1``.
        n_mels: mel bands, ``>= 1``.
        pad_to: the batch's frame count is padded up to a multiple of this (``>= 1``; 1: no padding), with the
            features of silence, as speech toolkits do (NeMo's preprocessor pads to 16): batches of padded clips
            then come in a few shapes instead of one per longest clip, and what a model or its kernels prepare per
            input shape is reused (the STFT's too: the waveforms are padded to one length per frame count). The
            frame lengths returned are the clips' own. The last frames of a batch's
            longest clip see zeros past its end instead of a reflection of it.
    """

    def __init__(self, source_rate: int = 16_000, rate: int = 16_000, n_fft: int = 400, hop: int = 160,
                 n_mels: int = 80, pad_to: int = 1) -> None:  # fmt: skip
        for name, value, low in (("source_rate", source_rate, 1), ("rate", rate, 1), ("n_fft", n_fft, 2),
                                 ("hop", hop, 1), ("n_mels", n_mels, 1), ("pad_to", pad_to, 1)):  # fmt: skip
            checks.check_int(name, value, low=low)
        self.source_rate, self.rate, self.n_fft, self.hop, self.n_mels = source_rate, rate, n_fft, hop, n_mels
        self.pad_to = pad_to
        self._cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._cache:
            def mel(f: torch.Tensor) -> torch.Tensor:
                return 2595 * torch.log10(1 + f / 700)

            edges = torch.linspace(float(mel(torch.tensor(0.0))), float(mel(torch.tensor(self.rate / 2))),
                                   self.n_mels + 2)  # fmt: skip
            hz = 700 * (10 ** (edges / 2595) - 1)
            freqs = torch.linspace(0, self.rate / 2, self.n_fft // 2 + 1)
            lo, mid, hi = hz[:-2, None], hz[1:-1, None], hz[2:, None]
            up = (freqs - lo) / (mid - lo).clamp(min=1e-6)
            down = (hi - freqs) / (hi - mid).clamp(min=1e-6)
            fb = torch.clamp(torch.minimum(up, down), min=0)
            self._cache[device] = (fb.to(device), torch.hann_window(self.n_fft, device=device))
        return self._cache[device]

    def __call__(self, batch: Any) -> Any:
        waves, lengths, *rest = batch
        x = waves.float()
        if not waves.is_floating_point():  # integer PCM: int16 full scale is 32768
            x = x * (1.0 / (torch.iinfo(waves.dtype).max + 1))
        lengths = lengths.to(x.device)
        if self.source_rate != self.rate:
            # one fixed ratio (not a size per batch): a clip resamples the same alone and padded in a batch
            x = F.interpolate(x[:, None], scale_factor=self.rate / self.source_rate, mode="linear",
                              align_corners=False, recompute_scale_factor=False)[:, 0]  # fmt: skip
            lengths = torch.round(lengths.float() * self.rate / self.source_rate).long()
        fb, window = self._constants(x.device)
        if self.pad_to > 1:
            # zeros after the end, up to the last sample count with the frame count (samples // hop + 1) at the next
            # multiple of pad_to: the STFT then sees one input length per frame count (on CUDA, a cuFFT plan is made
            # per input shape), not one per longest clip
            frames = -(-(x.shape[-1] // self.hop + 1) // self.pad_to) * self.pad_to
            x = F.pad(x, (0, frames * self.hop - 1 - x.shape[-1]))
        spec = torch.stft(x, self.n_fft, self.hop, window=window, return_complex=True).abs() ** 2
        features = torch.log(torch.matmul(fb, spec) + 1e-6).transpose(1, 2)  # N x frames x mels
        frames = torch.div(lengths, self.hop, rounding_mode="floor") + 1
        return (features, frames.clamp(max=features.shape[1]), *rest)
