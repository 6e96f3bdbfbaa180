"""The batch-transform helpers (core/gpu_transforms.py) on CPU tensors: what they compute, per-sample draws, and
that padding never leaks into a crop; the same code runs on CUDA batches inside StreamPrefetch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_gpu_boost.core.gpu_transforms import JointAugment, LogMel, RandomResizedCropFlip, pad_collate
from lightning_gpu_boost.core.prefetch import StreamPrefetcher


def test_pad_collate_pads_and_keeps_sizes():
    images, sizes, labels = pad_collate([(torch.ones(3, 4, 6, dtype=torch.uint8), 1),
                                         (torch.ones(3, 5, 2, dtype=torch.uint8), 2)])  # fmt: skip
    assert images.shape == (2, 3, 5, 6) and sizes.tolist() == [[4, 6], [5, 2]] and labels.tolist() == [1, 2]
    assert images[0, :, 4:].sum() == 0 and images[1, :, :, 2:].sum() == 0


def test_the_whole_image_crop_is_a_bilinear_resize_and_padding_never_leaks():
    torch.manual_seed(0)
    image = torch.randint(0, 256, (3, 40, 40), dtype=torch.uint8)
    whole = RandomResizedCropFlip(size=20, scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=False)
    out, _ = whole((image[None], torch.tensor([[40, 40]]), torch.tensor([0])))
    expected = F.interpolate(image[None].float() / 255, size=(20, 20), mode="bilinear", align_corners=False)
    assert torch.allclose(out, expected, atol=1e-5)
    # white images of different sizes padded with black: no crop may reach the padding
    samples = [(torch.full((3, h, w), 255, dtype=torch.uint8), 0) for h, w in ((30, 50), (64, 20), (17, 17))]
    crop = RandomResizedCropFlip(size=16)
    for _ in range(20):
        out, _ = crop(pad_collate(samples)[:1] + pad_collate(samples)[1:2] + (torch.zeros(3),))
        assert out.min() > 0.999, "a crop sampled the padding"


def test_crops_and_flips_are_drawn_per_sample():
    torch.manual_seed(1)
    x = torch.arange(64 * 64, dtype=torch.float32).view(1, 1, 64, 64).repeat(8, 3, 1, 1) % 256
    images, sizes = x.to(torch.uint8), torch.full((8, 2), 64)
    out, _ = RandomResizedCropFlip(size=16, normalize=((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)))((images, sizes, None))
    assert out.shape == (8, 3, 16, 16) and len({tuple(o.flatten()[:8].tolist()) for o in out}) == 8
    with pytest.raises(ValueError, match="scale must be"):
        RandomResizedCropFlip(scale=(0.5, 0.2))


def test_joint_augment_moves_image_and_mask_together():
    torch.manual_seed(2)
    mask = torch.zeros(4, 48, 48, dtype=torch.long)
    mask[:, 8:30, 10:40] = 3
    mask[:, 30:44, 4:20] = 7
    image = (mask.float() / 10)[:, None].repeat(1, 3, 1, 1)  # the image says which class each pixel is
    out, m = JointAugment(degrees=40, jitter=0.0)((image, mask))
    inside = m != 255
    agree = (out[:, 0][inside] * 10).round().long() == m[inside]
    assert m.dtype == torch.long and inside.float().mean() > 0.5 and agree.float().mean() > 0.9  # bilinear vs nearest at the regions' edges
    moved = JointAugment(degrees=40, jitter=0.0)((image, mask))[1]
    assert not torch.equal(moved[0], moved[1]), "every sample draws its own rotation"


def test_joint_augment_crops_and_warps_image_and_mask_together():
    torch.manual_seed(4)
    mask = torch.zeros(6, 64, 80, dtype=torch.long)
    mask[:, 8:40, 10:60] = 3
    mask[:, 40:60, 4:30] = 7
    image = (mask.float() / 10)[:, None].repeat(1, 3, 1, 1)
    out, m = JointAugment(degrees=20, jitter=0.0, size=32, elastic=0.05)((image, mask))
    assert out.shape == (6, 3, 32, 32) and m.shape == (6, 32, 32)
    inside = m != 255
    agree = (out[:, 0][inside] * 10).round().long() == m[inside]
    assert inside.float().mean() > 0.5 and agree.float().mean() > 0.9
    with pytest.raises(ValueError, match="size=128"):
        JointAugment(size=128)((image, mask))


def test_log_mel_of_a_padded_batch_matches_each_clip_alone():
    torch.manual_seed(3)
    clips = [torch.randn(44_100), torch.randn(30_000)]
    lengths = torch.tensor([len(c) for c in clips])
    waves = torch.zeros(2, 44_100)
    waves[1, :30_000] = clips[1]
    waves[0] = clips[0]
    mel = LogMel(source_rate=44_100, rate=16_000)
    features, frames, labels = mel((waves, lengths, torch.tensor([0, 1])))
    assert features.shape[0] == 2 and features.shape[2] == 80 and labels.tolist() == [0, 1]
    for k, clip in enumerate(clips):
        alone, alone_frames, _ = mel((clip[None], lengths[k : k + 1], None))
        n = int(alone_frames) - 3  # the last frames see the batch's zero padding instead of the clip's end
        assert int(frames[k]) == int(alone_frames)
        assert torch.allclose(features[k, :n], alone[0, :n], atol=1e-3), k


def test_log_mel_pads_the_frame_count_to_a_multiple_and_keeps_the_clips_features_and_lengths():
    torch.manual_seed(5)
    waves = torch.randn(3, 30_000) * 0.1
    lengths = torch.tensor([30_000, 25_000, 12_345])
    plain, frames, _ = LogMel(source_rate=16_000, rate=16_000)((waves, lengths, None))
    padded, padded_frames, _ = LogMel(source_rate=16_000, rate=16_000, pad_to=16)((waves, lengths, None))
    assert plain.shape[1] == 30_000 // 160 + 1 == 188 and padded.shape[1] == 192  # up to a multiple of 16
    assert torch.equal(frames, padded_frames)  # the clips' own lengths
    n = plain.shape[1] - 2  # the same features, but the longest clip's last frames (zeros after it, not a mirror)
    assert torch.allclose(padded[:, :n], plain[:, :n], atol=1e-4)
    assert torch.allclose(padded[:, -3:], torch.full_like(padded[:, -3:], math.log(1e-6)), atol=1e-4)  # silence
    with pytest.raises(ValueError, match="pad_to"):
        LogMel(pad_to=0)


def test_log_mel_with_pad_to_gives_the_stft_one_waveform_length_per_frame_count(monkeypatch):
    seen = []
    stft = torch.stft

    def recording(x, *args, **kwargs):
        seen.append(x.shape[-1])
        return stft(x, *args, **kwargs)

    monkeypatch.setattr(torch, "stft", recording)
    mel = LogMel(source_rate=16_000, rate=16_000, pad_to=16)
    shapes = {mel((torch.zeros(2, n), torch.tensor([n, n // 2]), None))[0].shape for n in (28_500, 29_000, 30_560)}
    assert shapes == {(2, 192, 80)} and seen == [192 * 160 - 1] * 3  # the longest length with 192 frames


def test_log_mel_of_int16_pcm_equals_the_float_waveform():
    torch.manual_seed(4)
    pcm = (torch.randn(2, 22_050) * 3000).clamp(-32768, 32767).to(torch.int16)
    lengths = torch.tensor([22_050, 20_000])
    mel = LogMel(source_rate=22_050, rate=16_000)
    from_pcm, frames, _ = mel((pcm, lengths, None))
    from_float, frames_f, _ = mel((pcm.float() / 32768, lengths, None))
    assert torch.equal(frames, frames_f) and torch.allclose(from_pcm, from_float, atol=1e-5)


@pytest.mark.gpu
def test_helpers_never_wait_for_the_gpu():
    # a host sync inside a transform on the side stream waits for the step the side stream waits on: the next
    # step is launched late every batch (JointAugment's tensor made from a list cost 3 ms per U-Net step)
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    images = torch.randint(0, 256, (4, 3, 48, 56), dtype=torch.uint8, device="cuda")
    masks = torch.randint(0, 5, (4, 48, 56), device="cuda")
    sizes = torch.tensor([[48, 56], [40, 50], [48, 30], [20, 56]], device="cuda")
    waves = torch.randint(-3000, 3000, (4, 44_100), dtype=torch.int16, device="cuda")
    lengths = torch.full((4,), 44_100, device="cuda")
    helpers = [
        (JointAugment(size=32, degrees=20, elastic=0.05, jitter=0.2), (images, masks)),
        (RandomResizedCropFlip(24, normalize=((0.5, 0.5, 0.5), (0.2, 0.2, 0.2))), (images, sizes)),
        (LogMel(44_100, 16_000), (waves, lengths)),
    ]
    for transform, batch in helpers:
        transform(batch)  # the first call may make constants (filterbank, normalization) once per device
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for transform, batch in helpers:
            transform(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_helpers_run_inside_the_prefetcher_with_its_seeds():
    samples = [(torch.randint(0, 256, (3, 20 + k, 30 - k), dtype=torch.uint8), k) for k in range(4)]
    batches = [pad_collate(samples) for _ in range(3)]
    crop = RandomResizedCropFlip(size=8)
    a = [b[0] for b in StreamPrefetcher(batches, device="cpu", transform=crop, seed=5)]
    b = [b[0] for b in StreamPrefetcher(batches, device="cpu", transform=crop, seed=5, depth=2)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)) and not torch.equal(a[0], a[1])


@pytest.mark.gpu
def test_helpers_give_the_same_numbers_on_the_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    samples = [(torch.randint(0, 256, (3, 40 + k, 50 - k), dtype=torch.uint8), k) for k in range(8)]
    batch = pad_collate(samples)
    crop = RandomResizedCropFlip(size=24, flip=False, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    cpu = crop(batch)[0]
    gpu = crop(tuple(t.cuda() for t in batch))[0].cpu()
    assert torch.allclose(cpu, gpu, atol=1e-4)
    mel = LogMel(44_100, 16_000)
    waves = torch.randn(4, 44_100)
    lengths = torch.full((4,), 44_100)
    assert torch.allclose(mel((waves, lengths))[0], mel((waves.cuda(), lengths.cuda()))[0].cpu(), atol=1e-3)
    mask = torch.zeros(6, 64, 80, dtype=torch.long, device="cuda")
    mask[:, 8:40, 10:60] = 3
    image = (mask.float() / 10)[:, None].repeat(1, 3, 1, 1)
    out, m = JointAugment(degrees=20, jitter=0.0, size=32, elastic=0.05)((image, mask))
    inside = m != 255
    assert out.is_cuda and m.shape == (6, 32, 32)
    assert ((out[:, 0][inside] * 10).round().long() == m[inside]).float().mean() > 0.9


def test_random_resized_crop_antialias_shrinks_noise_like_a_box_filter():
    torch.manual_seed(0)
    noise = (torch.rand(8, 3, 400, 400) * 255).to(torch.uint8)
    batch = (noise, torch.tensor([[400, 400]] * 8), None)
    kwargs = {"scale": (1.0, 1.0), "ratio": (1.0, 1.0), "flip": False}
    aliased = RandomResizedCropFlip(50, antialias=False, **kwargs)(batch)[0]
    smooth = RandomResizedCropFlip(50, **kwargs)(batch)[0]
    # an 8x shrink of uniform noise (std 0.29): an 8 x 8 box leaves 0.036; bilinear taps of single pixels ~0.14
    assert smooth.std() < 0.05 < 0.1 < aliased.std()
    assert abs(smooth.mean() - aliased.mean()) < 0.01


def _torchvision_box(height, width, scale, ratio, rng):
    """torchvision's RandomResizedCrop.get_params, transcribed (torchvision is not a dependency)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = int(round(math.sqrt(target_area * aspect))), int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w, True
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w, False


@pytest.mark.parametrize("height, width", [(375, 500), (600, 200), (64, 64)])
def test_random_resized_crop_boxes_follow_torchvisions_rule(height, width):
    import random

    n, scale, ratio = 20_000, (0.08, 1.0), (3 / 4, 4 / 3)
    torch.manual_seed(0)
    boxes = RandomResizedCropFlip(32).boxes(torch.tensor([[height, width]] * n))
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= height).all() and (left + w <= width).all()
    rng = random.Random(0)
    ref = torch.tensor([_torchvision_box(height, width, scale, ratio, rng)[:4] for _ in range(n)], dtype=torch.float)
    for ours, theirs in ((h * w / (height * width), ref[:, 2] * ref[:, 3] / (height * width)), (w / h, ref[:, 3] / ref[:, 2]),
                         (top / height, ref[:, 0] / height), (left / width, ref[:, 1] / width)):  # fmt: skip
        assert abs(float(ours.mean() - theirs.mean())) < 0.01 and abs(float(ours.std() - theirs.std())) < 0.01
    # the fallback (no draw fits): the whole image at the nearest allowed aspect ratio, centred
    tall = RandomResizedCropFlip(8, scale=(1.0, 1.0), ratio=(1.0, 1.0)).boxes(torch.tensor([[600, 200]]))
    assert tall.tolist() == [[200.0, 0.0, 200.0, 200.0]]


def test_joint_augment_without_change_returns_its_input():
    # no rotation, zoom, flip, jitter or crop: the sampling grid hits the pixel centres, the mask is gathered as it is
    torch.manual_seed(5)
    images = torch.randint(0, 256, (3, 3, 40, 56), dtype=torch.uint8)
    masks = torch.randint(0, 9, (3, 40, 56))
    aug = JointAugment(degrees=0.0, scale=(1.0, 1.0), flip=False, jitter=0.0)
    out, m = aug((images, masks))
    assert torch.equal(m, masks) and m.dtype == masks.dtype
    small = masks.to(torch.uint8).masked_fill_(masks == 0, 255)  # uint8 masks with 255 labels come back as they were
    assert torch.equal(aug((images, small))[1], small)
    torch.testing.assert_close(out, images.float() / 255, atol=1e-5, rtol=0)
    # uint8 images and the same images as floats in [0, 1] augment alike (the 1/255 is folded into the jitter)
    jitter = JointAugment(degrees=25.0, jitter=0.3, size=32, elastic=0.05)
    torch.manual_seed(6)
    a = jitter((images, masks))
    torch.manual_seed(6)
    b = jitter((images.float() / 255, masks))
    assert torch.equal(a[1], b[1])
    torch.testing.assert_close(a[0], b[0], atol=1e-5, rtol=0)


def test_joint_augment_grid_is_affine_grid_plus_a_bicubic_field():
    from lightning_gpu_boost.core.gpu_transforms import _warp_grid

    theta = torch.randn(4, 2, 3, generator=torch.Generator().manual_seed(0))
    grid = _warp_grid(theta, 0.0, (0.8, 0.8), 50, 60)
    torch.testing.assert_close(grid, F.affine_grid(theta, [4, 1, 50, 60], align_corners=False), atol=1e-6, rtol=0)
    torch.manual_seed(1)
    warped = _warp_grid(theta, 0.05, (0.8, 0.7), 50, 60)
    torch.manual_seed(1)  # the same draws, upsampled the way the matrices stand for
    field = torch.zeros(4, 2, 8, 8)
    field[:, 0].normal_(0.0, 0.05 * 0.8)
    field[:, 1].normal_(0.0, 0.05 * 0.7)
    field = F.interpolate(field, size=(50, 60), mode="bicubic", align_corners=False).permute(0, 2, 3, 1)
    torch.testing.assert_close(warped, grid + field, atol=1e-6, rtol=0)


class _HWCImages(torch.utils.data.Dataset):
    """Images decoded as HWC arrays, handed over as their CHW view (as a PIL or numpy decoder's are)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        hwc = torch.randint(0, 256, (20 + i, 24 - i, 3), dtype=torch.uint8, generator=g)
        return hwc.permute(2, 0, 1), i


def test_pad_collate_keeps_the_layout_and_shares_memory_in_workers():
    samples = [_HWCImages()[i] for i in range(4)]
    images, sizes, _ = pad_collate(samples)
    assert images.shape == (4, 3, 23, 24) and images.is_contiguous(memory_format=torch.channels_last)
    contiguous, _, _ = pad_collate([(x.contiguous(), y) for x, y in samples])
    assert contiguous.is_contiguous() and torch.equal(images, contiguous)
    assert images[3, :, 23:].numel() == 0 and int(images[0, :, 20:].sum()) == 0  # zero padding
    floats, _, _ = pad_collate([(x.float(), y) for x, y in samples])  # other dtypes too
    assert floats.dtype == torch.float32 and torch.equal(floats, contiguous.float())
    loader = torch.utils.data.DataLoader(_HWCImages(), batch_size=4, collate_fn=pad_collate, num_workers=1)
    batches = list(loader)
    assert all(b[0].is_shared() for b in batches)
    assert torch.equal(batches[0][0], images) and batches[0][0].stride() == images.stride()
    # the GPU crops read either layout alike
    crop = RandomResizedCropFlip(size=16)
    torch.manual_seed(0)
    a = crop((images, sizes, None))[0]
    torch.manual_seed(0)
    b = crop((contiguous, sizes, None))[0]
    torch.testing.assert_close(a, b)
