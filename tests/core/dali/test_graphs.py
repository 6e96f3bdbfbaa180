"""DALI graphs (``core/dali/graphs.py``) on real CPU pipelines: dtypes and layouts, a deterministic validation
graph, the audio graph."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from lightning_gpu_boost.core.dali import (
    DALILoader,
    FileListSource,
    audio_graph,
)

pytest.importorskip("nvidia.dali", reason="needs the `dali` extra")
from tests.core.dali.shared import loader


def _wav(path, samples):
    import wave

    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(16_000)
        f.writeframes(samples.astype("<i2").tobytes())


@pytest.fixture
def wav_clips(tmp_path):
    rng = np.random.default_rng(0)
    clips = [rng.integers(-3000, 3000, int(n)).astype(np.int16) for n in rng.integers(800, 2400, 10)]
    paths = []
    for k, clip in enumerate(clips):
        paths.append(tmp_path / f"clip_{k}.wav")
        _wav(paths[-1], clip)
    return paths, clips


@pytest.mark.parametrize(
    "dtype, channels_last, normalize, expected",
    [("float16", False, "imagenet", torch.float16), ("bfloat16", True, "imagenet", torch.bfloat16),
     ("uint8", True, None, torch.uint8)],
)  # fmt: skip
def test_dtypes_and_channels_last(jpeg_tree, dtype, channels_last, normalize, expected):
    images, _ = next(
        iter(loader(jpeg_tree, train=False, dtype=dtype, channels_last=channels_last, normalize=normalize))
    )
    assert images.dtype == expected and images.shape == (4, 3, 16, 16)
    assert images.is_contiguous(memory_format=torch.channels_last) == channels_last
    if dtype == "uint8":
        assert images.max() > 1  # 0-255 pixels


def test_validation_graph_is_deterministic(jpeg_tree):
    dl = loader(jpeg_tree, train=False, shuffle=False, batch_size=8)
    a, b = next(iter(dl))[0], next(iter(dl))[0]
    assert torch.equal(a, b)
    assert abs(float(a.mean())) < 2  # normalized


def test_audio_graph_yields_padded_waveforms_lengths_and_labels_exactly_once(wav_clips):
    paths, clips = wav_clips
    dl = DALILoader(FileListSource(paths, list(range(10))), functools.partial(audio_graph, gpu=False), 4,
                    num_threads=1, read_threads=2)  # fmt: skip
    assert dl.reads_in_dali and len(dl) == 3
    for _ in range(2):
        batches = list(dl)
        assert sorted(sum((labels.tolist() for *_, labels in batches), [])) == list(range(10))
    for waves, lengths, labels in batches:
        assert waves.dtype == torch.int16 and waves.shape == (len(labels), int(lengths.max()))
        for wave, n, label in zip(waves, lengths.tolist(), labels.tolist(), strict=True):
            assert n == len(clips[label]) and torch.equal(wave[:n], torch.from_numpy(clips[label]))
            assert not wave[n:].any()  # zeros after the clip
    with pytest.raises(ValueError, match="one label per file"):
        FileListSource(paths, [0])
    with pytest.raises(FileNotFoundError, match="no file at"):
        FileListSource([paths[0].parent / "missing.wav"], [0])
    with pytest.raises(ValueError, match="dtype must be 'int16' or 'float32'"):
        audio_graph(None, gpu=False, dtype="int8")


def test_audio_graph_skips_no_audio_as_a_broken_image(wav_clips):
    # bad_samples="skip" makes Python read and check the bytes: a FileListSource checks nothing (no image rules)
    paths, clips = wav_clips
    dl = DALILoader(FileListSource(paths, list(range(10))), functools.partial(audio_graph, gpu=False, dtype="float32"),
                    5, num_threads=1, read_threads=2, bad_samples="skip")  # fmt: skip
    assert not dl.reads_in_dali
    waves, lengths, labels = next(iter(dl))
    assert waves.dtype == torch.float32 and len(labels) == 5
    k = int(labels[0])
    assert torch.allclose(waves[0, : lengths[0]], torch.from_numpy(clips[k] / 32768).float(), atol=1e-4)


@pytest.mark.gpu
def test_audio_graph_on_the_gpu_gives_the_cpu_pipelines_batches(wav_clips):
    paths, _ = wav_clips

    def batches(device_id):
        dl = DALILoader(FileListSource(paths, list(range(10))), functools.partial(audio_graph, gpu=device_id is not None),
                        4, device_id=device_id, num_threads=2, read_threads=2, pipelines=2)  # fmt: skip
        try:
            epoch = list(dl)
            return [tuple(t.cpu() for t in b) for b in epoch], [b[0].device.type for b in epoch]
        finally:
            dl.close()

    (cpu, _), (gpu, where) = batches(None), batches(torch.cuda.current_device())
    assert set(where) == {"cuda"} and len(cpu) == len(gpu) == 3
    for a, b in zip(cpu, gpu, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
