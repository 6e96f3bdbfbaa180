"""The documented best for each data-bound workload (harness, not part of the projects: it uses this package),
run by ``python benchmarks/workloads`` as the case ``best`` beside plain, ``GPUBoost()`` and the ceiling.

Each builder takes the workload's data and size and returns ``(model, train loader, val loader or None, trainer
kwargs, callbacks)``: the project's own model and precision, its loader changed only as docs/workloads.md says.

- ``jpeg_classification``: the workers only decode (uint8, ``pad_collate``); crop, flip and normalize run on the GPU
  (``GPUBoost(transform=RandomResizedCropFlip(...))``).
- ``photos_hr``: the photos shrunk once, as FFCV and ``lightning-gpu-boost pack --max-side 256`` do (shorter side
  256, JPEG quality 90, :func:`~lightning_gpu_boost.core.images.shrink_image` in one process per core; its seconds
  are recorded as ``one_time_s``), then the jpeg best: 12-megapixel decoding costs about 40 ms per photo on one core
  even at the coarsest DCT scale (the entropy decoding of the whole file stays), more than 16 cores can pay per step.
  On a GPU with DALI installed the shrunk photos go through ``DALIDataModule`` (its threads decode, the GPU
  crops and resizes, no worker processes beside the launch-bound step); otherwise its 24-batch epochs go through
  :class:`~lightning_gpu_boost.core.spanning.SpanningLoader` (no wait at epoch starts).
- ``segmentation``: the workers decode image and mask; rotation, elastic warp, crop, flip and colour run on the GPU
  (``JointAugment``).
- ``audio``: on a GPU with DALI installed, ``DALIFeatures``: DALI reads and decodes the WAV files in its threads and
  computes the log-mel features on the GPU (resampling, power spectrogram, HTK mel filterbank, log, frames padded
  to a multiple of 64), as NeMo's DALI preprocessing does; the training thread only takes finished batches, no
  worker processes beside its launch-bound step. Otherwise the project's 4 workers (kept between epochs) read the
  waveforms and resample them to 16 kHz (linear interpolation, int16: 2.75x fewer bytes per batch through shared
  memory and pinning), log-mel on the GPU (``LogMel`` as GPUBoost's transform, frames padded to a multiple of 64).
  ``DALILoader`` with ``audio_graph`` and ``LogMel`` (exact epochs) is the diagnostic's ``dali_loader``.
- ``tabular``: the table fits on the GPU (2 M rows x 64 floats: 512 MB), so it goes there once; the loader yields
  only each batch's shuffled indices (one tensor, ``ShuffledBatches``, the permutation drawn on the GPU) and
  ``GatherRows``, the GPU transform, gathers the rows there: no per-sample Python, no rows through worker pipes or
  pinned memory.
- ``speech_ctc``: the workers read 16-bit PCM and the transcripts only; the Kaldi-style filterbank, per-utterance
  normalization and SpecAugment run on the GPU per batch (``SpeechFeatures``, GPUBoost's transform).
- ``vit_finetune``: the workers keep the project's augmentation (RandomResizedCrop, flip, RandAugment: Pillow on
  uint8 pixels) and ship uint8; ToTensor's conversion and Normalize run on the GPU (``GPUBoost(normalize=...)``).
- ``short_epochs``: on a GPU with DALI installed, ``DALIDataModule`` (DALI plans the next epoch while this one ends
  and validates; its CPU threads decode each random crop, the GPU resizes and normalizes; validation over the
  project's validation images, one whole DALI epoch per pass), with GPUBoost's step settings. Otherwise the jpeg
  best through :class:`~lightning_gpu_boost.core.spanning.SpanningLoader` for training and validation (one
  iterator across epochs; 2 validation workers loading only its 2 batches per pass).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Sampler

from lightning_gpu_boost._imports import module_available
from lightning_gpu_boost.callbacks import GPUBoost
from lightning_gpu_boost.core.gpu_transforms import JointAugment, LogMel, RandomResizedCropFlip, pad_collate
from lightning_gpu_boost.core.images import shrink_image
from lightning_gpu_boost.core.spanning import SpanningLoader

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
#: seconds each best's one-time preparation took in this process (e.g. shrinking the photos), by workload
ONE_TIME: dict[str, float] = {}


class Decoded(Dataset):
    """The ImageNet-style tree decoded to uint8 CHW tensors, nothing else (the transforms run on the GPU)."""

    def __init__(self, root: Path) -> None:
        self.samples = sorted((p, int(p.parent.name.split("_")[1])) for p in Path(root).glob("class_*/*.jpg"))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        img = np.asarray(Image.open(path).convert("RGB"))
        return torch.from_numpy(img.copy()).permute(2, 0, 1), label


class RawPairs(Dataset):
    """The segmentation pairs decoded to a uint8 image and an int64 mask, nothing else."""

    def __init__(self, root: Path) -> None:
        self.images = sorted((Path(root) / "images").glob("*.jpg"))

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        path = self.images[i]
        image = np.asarray(Image.open(path).convert("RGB"))
        mask = np.asarray(Image.open(path.parent.parent / "masks" / f"{path.stem}.png"))
        return torch.from_numpy(image.copy()).permute(2, 0, 1), torch.from_numpy(mask.astype(np.int64))


class Waves(Dataset):
    """The audio clips as 16-bit PCM: at their own rate, or resampled to ``rate`` from ``source_rate`` (the same
    linear interpolation as ``LogMel``'s, back to int16). ``LogMel`` scales them (and resamples the others) on the
    GPU; int16 is half the bytes of float32 through the workers' shared memory, pinning and the copy, and 16 kHz
    2.75x fewer than 44.1 kHz."""

    def __init__(self, root: Path, source_rate: int | None = None, rate: int | None = None) -> None:
        self.files = sorted(Path(root).glob("*.wav"))
        self.scale = rate / source_rate if rate and source_rate and rate != source_rate else None

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        wave = torch.from_numpy(read_pcm16(self.files[i]))
        if self.scale is not None:
            wave = F.interpolate(wave.float()[None, None], scale_factor=self.scale, mode="linear", align_corners=False,
                                 recompute_scale_factor=False)[0, 0].round().clamp(-32768, 32767).to(torch.int16)  # fmt: skip
        return wave, i % 10


def read_pcm16(path: Path) -> np.ndarray:
    """A mono 16-bit WAV file's samples as int16 (soundfile where installed, else the stdlib ``wave``)."""
    try:
        import soundfile

        return soundfile.read(path, dtype="int16")[0]
    except ImportError:
        import wave

        with wave.open(str(path), "rb") as f:
            return np.frombuffer(f.readframes(f.getnframes()), dtype="<i2").copy()


def pad_waves(batch):
    waves, labels = zip(*batch, strict=True)
    return (torch.nn.utils.rnn.pad_sequence(waves, batch_first=True), torch.tensor([len(w) for w in waves]),
            torch.tensor(labels))  # fmt: skip


class ShuffledBatches(Sampler):
    """Each batch's indices as one tensor, a random permutation cut into batches (no per-index Python): the
    sampler of a loader with ``batch_size=None`` whose rows live on the GPU. With ``device`` the permutation is
    drawn there (no epoch start spent drawing 2 M numbers on the CPU, no indices copied per batch)."""

    def __init__(self, n: int, batch_size: int, device: str | None = None) -> None:
        self.n, self.batch_size, self.device = n, batch_size, device

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def __iter__(self):
        return iter(torch.randperm(self.n, device=self.device).split(self.batch_size))


class Identity(Dataset):
    """``dataset[index] == index``: the loader yields what its sampler names."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index):
        return index


class GatherRows:
    """The GPU transform that turns a batch of indices into ``(x, y)`` rows of a table held on the GPU (moved there
    on first use, once per device)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, index: torch.Tensor):
        if index.device not in self._on:
            self._on[index.device] = (self.x.to(index.device), self.y.to(index.device))
        x, y = self._on[index.device]
        return x[index], y[index]


def _boost(size: str, transform: Any = None, val_transform: Any = None, auto_workers: bool = True) -> GPUBoost:
    # on a CPU (tests) the worker probe is left out: seconds matter there, and the step runs on the same cores
    return GPUBoost(transform=transform, val_transform=val_transform, auto_workers=auto_workers and size == "gpu")


def _loader(dataset: Dataset, cfg: dict, size: str, collate: Any = None, workers: int | None = None,
            **kwargs: Any) -> DataLoader:  # fmt: skip
    if workers is None:
        workers = (os.cpu_count() or 1) if size == "gpu" else cfg.get("workers", 1)
    kwargs.setdefault("persistent_workers", workers > 0)  # no worker restarts at epoch ends
    return DataLoader(dataset, batch_size=cfg["batch"], shuffle=kwargs.pop("shuffle", True), num_workers=workers,
                      pin_memory=size == "gpu", collate_fn=collate, drop_last=True, **kwargs)  # fmt: skip


def _shrink_one(job: tuple[str, str, int]) -> None:
    src, dst, side = job
    data = Path(src).read_bytes()
    Path(dst).write_bytes(shrink_image(data, side) or data)


def shrunk_tree(root: Path, side: int) -> Path:
    """A copy of the class-folder tree ``root`` with every image's shorter side at most ``side`` (made once)."""
    out = Path(f"{root}-shrunk{side}")
    if (out / ".complete").exists():
        return out
    jobs = []
    for path in sorted(Path(root).glob("class_*/*.jpg")):
        (out / path.parent.name).mkdir(parents=True, exist_ok=True)
        jobs.append((str(path), str(out / path.parent.name / path.name), side))
    with multiprocessing.Pool(os.cpu_count() or 1) as pool:
        pool.map(_shrink_one, jobs, chunksize=max(1, len(jobs) // (4 * (os.cpu_count() or 1))))
    (out / ".complete").touch()
    return out


def jpeg_classification(data: Path, size: str):
    import jpeg_classification as w

    cfg = w.SIZES[size]
    model, _, _, kwargs = w.build(data, size)
    crop = RandomResizedCropFlip(cfg["crop"], normalize=(MEAN, STD))
    return model, _loader(Decoded(data), cfg, size, pad_collate), None, kwargs, [_boost(size, crop)]


def photos_hr(data: Path, size: str):
    import photos_hr as w

    cfg = w.SIZES[size]
    model, _, _, kwargs = w.build(data, size)
    side, started = 256 if size == "gpu" else cfg["crop"], time.perf_counter()
    made = not (Path(f"{data}-shrunk{side}") / ".complete").exists()
    shrunk = shrunk_tree(data, side)
    if made:  # what shrinking the photos once took (16 processes on the H100 machine)
        ONE_TIME["photos_hr"] = time.perf_counter() - started
    if size == "gpu" and module_available("nvidia.dali"):
        # DALI decodes the crop of each shrunk photo in its threads and resizes on the GPU, across the 24-batch
        # epochs (no restart): the batch-32 step is launch-bound, and 16 worker processes left it short of CPU
        return model, _dali(shrunk, None, cfg), None, kwargs, [_step_settings()]
    crop = RandomResizedCropFlip(cfg["crop"], normalize=(MEAN, STD))
    # 24 batches per epoch: one iterator across epochs, so that no epoch starts by waiting for its first batches;
    # GPUBoost's worker tuner sets the count. Leaving two cores to the launch-bound step (14 workers by hand) was
    # not better where measured: 1,141 photos/s at 2e4ebfe, 752 (73 % of the ceiling) on a slower machine at 977fb62
    loader = _loader(Decoded(shrunk), cfg, size, pad_collate, persistent_workers=False)
    train = SpanningLoader(loader)
    return model, train, None, kwargs, [_boost(size, crop)]


def segmentation(data: Path, size: str):
    import segmentation as w

    cfg = w.SIZES[size]
    model, _, _, kwargs = w.build(data, size)
    aug = JointAugment(size=cfg["crop"], degrees=30.0, elastic=0.05, jitter=0.3, ignore_index=0)
    return model, _loader(RawPairs(data), cfg, size), None, kwargs, [_boost(size, aug)]


class DALIFeatures:
    """Log-mel features of the clips computed by DALI end to end, as NeMo's DALI preprocessing does: DALI's file
    reader (shuffled anew each epoch) and audio decoder in its CPU threads, then on the GPU resampling, the power
    spectrogram (Hann window, centred, reflected edges), an 80-band HTK mel filterbank, ``log(x + 1e-6)``, frames
    padded with silence to a multiple of ``pad_to``; ``DALIGenericIterator``. Batches ``(features N x frames x
    mels, frame lengths, labels)`` on the GPU: the training thread only takes finished batches (no transform
    launches of its own, no Python feeding DALI)."""

    batches_on_device = True

    def __init__(self, files, labels, batch_size: int, device_id: int, threads: int, source_rate: int, rate: int,
                 n_fft: int, hop: int, mels: int, pad_to: int = 64) -> None:  # fmt: skip
        import math

        import nvidia.dali.math as dmath
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=device_id, seed=0)
        def features():
            encoded, label = fn.readers.file(files=[str(f) for f in files], labels=labels, shuffle_after_epoch=True,
                                             name="reader")  # fmt: skip
            audio, _ = fn.decoders.audio(encoded, dtype=types.FLOAT, downmix=True)
            audio = fn.audio_resample(audio.gpu(), in_rate=float(source_rate), out_rate=float(rate))
            spec = fn.spectrogram(audio, nfft=n_fft, window_length=n_fft, window_step=hop, center_windows=True,
                                  reflect_padding=True, power=2, layout="ft")  # fmt: skip
            mel = fn.mel_filter_bank(spec, sample_rate=float(rate), nfilter=mels, freq_high=rate / 2, mel_formula="htk",
                                     normalize=False)  # fmt: skip
            feats = fn.transpose(dmath.log(mel + 1e-6), perm=[1, 0])
            frames = fn.reshape(fn.slice(feats.shape(dtype=types.INT64), 0, 1, axes=[0]), shape=[])
            return fn.pad(feats, axes=[0], align=pad_to, fill_value=math.log(1e-6)), frames, label.gpu()

        pipe = features()
        pipe.build()
        self.iterator = DALIGenericIterator([pipe], ["features", "frames", "labels"], reader_name="reader",
                                            last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)  # fmt: skip

    def __len__(self) -> int:
        return len(self.iterator)

    def __iter__(self):
        for (out,) in self.iterator:
            yield out["features"], out["frames"], out["labels"].reshape(-1).long()


def audio(data: Path, size: str):
    import audio as w

    cfg = w.SIZES[size]
    model, _, _, kwargs = w.build(data, size)
    # frames padded to a multiple of 64 on a GPU: 2-3 batch shapes instead of one per longest clip (cuDNN
    # autotuning stays on), as speech toolkits pad their features
    pad_to = 64 if size == "gpu" else 1
    if size == "gpu" and module_available("nvidia.dali"):
        # DALI reads, decodes, resamples and computes the log-mel features (no worker processes, no batches through
        # shared memory and a pin thread, no transform launches beside the launch-bound step): 0.92 of the ceiling
        # against 0.80 for DALILoader + LogMel in the same runs (benchmarks/diagnostics/audio_best_parts.py)
        from lightning_gpu_boost.core.cpus import usable_cpus

        files = sorted(Path(data).glob("*.wav"))
        loader = DALIFeatures(files, [i % 10 for i in range(len(files))], cfg["batch"], torch.cuda.current_device(),
                              max(1, usable_cpus() - 1), w.SOURCE_RATE, w.RATE, w.N_FFT, w.HOP, w.MELS, pad_to)  # fmt: skip
        return model, loader, None, kwargs, [_step_settings()]
    # without DALI: the workers read the waveforms and resample them to 16 kHz (cheap: linear interpolation) so
    # that a batch carries 2.75x fewer bytes through shared memory, pinning and the copy: 0.80 of the ceiling
    # against 0.70 resampling on the GPU, the same runs (benchmarks/diagnostics/audio_best_parts.py)
    mel = LogMel(source_rate=w.RATE, rate=w.RATE, n_fft=w.N_FFT, hop=w.HOP, n_mels=w.MELS, pad_to=pad_to)
    loader = DataLoader(Waves(data, w.SOURCE_RATE, w.RATE), batch_size=cfg["batch"], shuffle=True, num_workers=cfg["workers"],
                        pin_memory=size == "gpu", collate_fn=pad_waves, drop_last=True, persistent_workers=True)
    return model, loader, None, kwargs, [GPUBoost(transform=mel, auto_workers=False)]


def tabular(data: Path, size: str):
    import tabular as w

    model, loader, _, kwargs = w.build(data, size)
    rows = loader.dataset
    device = "cuda" if size == "gpu" and torch.cuda.is_available() else None  # the loader runs in this process
    indices = DataLoader(Identity(len(rows)), sampler=ShuffledBatches(len(rows), loader.batch_size, device),
                         batch_size=None)  # fmt: skip
    return model, indices, None, kwargs, [GPUBoost(transform=GatherRows(rows.x, rows.y), auto_workers=False)]


def short_epochs(data: Path, size: str):
    import short_epochs as w

    cfg = w.SIZES[size]
    model, _, _, kwargs = w.build(data, size)
    if size == "gpu" and module_available("nvidia.dali"):
        # DALI plans the next epoch's batches while this one ends (no restart), decodes the random crop in its
        # threads and resizes on the GPU; validation reads the project's validation images (the first
        # limit_val_batches batches of its unshuffled loader), so that each pass is one whole DALI epoch
        val = first_images(data, cfg["batch"] * kwargs["limit_val_batches"])
        return model, _dali(data, val, cfg), None, kwargs, [_step_settings()]
    crop = RandomResizedCropFlip(cfg["crop"], normalize=(MEAN, STD))
    # one iterator across epochs: the workers decode the next epoch's first batches while this one ends and
    # validates (a DataLoader starts them only when the epoch's iterator is made)
    train = SpanningLoader(_loader(Decoded(data), cfg, size, pad_collate, persistent_workers=False))
    # validation reads 2 batches per epoch: 2 workers that load only those 2 (the next pass's, in the background),
    # where each of 16 would decode its own prefetched batches, most of them never used
    val = SpanningLoader(DataLoader(Decoded(data), batch_size=cfg["batch"], num_workers=2, pin_memory=size == "gpu",
                                    collate_fn=pad_collate), batches_per_epoch=kwargs["limit_val_batches"])  # fmt: skip
    centre = RandomResizedCropFlip(cfg["crop"], scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=False, normalize=(MEAN, STD))
    return model, train, val, kwargs, [_boost(size, crop, centre)]


def _dali(train: Path, val: Path | None, cfg: dict):
    """``DALIDataModule`` over a class-folder tree: the projects' crop, flip and normalization, ``drop_last``."""
    from lightning_gpu_boost.datamodules import DALIDataModule

    return DALIDataModule(str(train), str(val) if val else None, batch_size=cfg["batch"], image_size=cfg["crop"],
                          normalize=(MEAN, STD), drop_last=True)  # fmt: skip


def _step_settings() -> GPUBoost:
    """GPUBoost's step settings (TF32, cuDNN, channels_last: the ceiling's), its data path left to DALI."""
    return GPUBoost(prefetch=False, auto_workers=False, watchdog=False)


def first_images(root: Path, n: int) -> Path:
    """A class-folder tree of links to the first ``n`` images of ``root`` in the projects' order (sorted paths: the
    images an unshuffled loader's first batches hold), made once."""
    out = Path(f"{root}-first{n}")
    if (out / ".complete").exists():
        return out
    for path in sorted(Path(root).glob("class_*/*.jpg"))[:n]:
        (out / path.parent.name).mkdir(parents=True, exist_ok=True)
        link = out / path.parent.name / path.name
        if not link.exists():
            link.symlink_to(path.resolve())
    (out / ".complete").touch()
    return out


class Utterances16(Dataset):
    """The speech utterances as 16-bit PCM with their transcripts' character ids: nothing computed per sample."""

    def __init__(self, root: Path) -> None:
        import speech_ctc as w

        self.files, self.alphabet = sorted(Path(root).glob("*.wav")), w.ALPHABET

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path = self.files[i]
        text = path.with_suffix(".txt").read_text().strip()
        return torch.from_numpy(read_pcm16(path)), torch.tensor([self.alphabet.index(c) + 1 for c in text])


def pad_utterances(batch):
    waves, labels = zip(*batch, strict=True)
    return (torch.nn.utils.rnn.pad_sequence(waves, batch_first=True), torch.tensor([len(w) for w in waves]),
            torch.nn.utils.rnn.pad_sequence(labels, batch_first=True), torch.tensor([len(t) for t in labels]))  # fmt: skip


class SpeechFeatures:
    """The speech project's features for a whole batch on the GPU: its Kaldi-style filterbank (dither, DC removal,
    pre-emphasis, Povey window, power spectrum, log mel energies), per-utterance mean/variance normalization over
    each utterance's own frames, and SpecAugment's two frequency and two time masks per utterance, as the workers
    computed them one utterance at a time."""

    def __init__(self) -> None:
        import speech_ctc as w

        self.w, self.banks = w, w._mel_banks()

    def __call__(self, batch):
        waves, lengths, labels, label_lengths = batch
        w = self.w
        frames = waves.float().unfold(1, w.FRAME, w.SHIFT)  # N x T x FRAME, int16 scale as Kaldi's
        frames = frames + torch.randn_like(frames)
        frames = frames - frames.mean(-1, keepdim=True)
        frames = torch.cat([frames[..., :1] * 0.03, frames[..., 1:] - 0.97 * frames[..., :-1]], -1)
        frames = frames * torch.hann_window(w.FRAME, periodic=False, device=frames.device).pow(0.85)
        power = torch.fft.rfft(frames, w.N_FFT).abs().pow(2)
        banks = self.banks.to(frames.device)
        feats = torch.log((power @ banks.T).clamp(min=1.1920929e-07))  # N x T x MELS
        counts = ((lengths - w.FRAME) // w.SHIFT + 1).clamp(min=1).to(feats.device)
        valid = (torch.arange(feats.shape[1], device=feats.device)[None] < counts[:, None])[..., None]
        mean = (feats * valid).sum(1, keepdim=True) / counts[:, None, None]
        var = ((feats - mean) ** 2 * valid).sum(1, keepdim=True) / (counts[:, None, None] - 1).clamp(min=1)
        feats = (feats - mean) / (var.sqrt() + 1e-5) * valid
        n, t, m = feats.shape
        keep = torch.ones_like(feats, dtype=torch.bool)
        for _ in range(2):  # frequency masks of up to 27 bands, time masks of up to 40 frames (a fifth at most)
            width = torch.randint(0, 28, (n, 1), device=feats.device)
            start = (torch.rand(n, 1, device=feats.device) * (m - width + 1)).long()
            bands = torch.arange(m, device=feats.device)[None]
            keep &= ~((bands >= start) & (bands < start + width))[:, None, :]
            width = (torch.rand(n, 1, device=feats.device) * (torch.minimum(counts[:, None] // 5,
                                                                              torch.tensor(40, device=feats.device)) + 1)).long()  # fmt: skip
            start = (torch.rand(n, 1, device=feats.device) * (counts[:, None] - width + 1)).long()
            steps = torch.arange(t, device=feats.device)[None]
            keep &= ~((steps >= start) & (steps < start + width))[:, :, None]
        return feats * keep, counts, labels, label_lengths


def speech_ctc(data: Path, size: str):
    """The workers read 16-bit PCM and transcripts only; filterbank, normalization and SpecAugment run on the GPU
    per batch (the advice for features: compute them on the GPU)."""
    import speech_ctc as w

    cfg = w.SIZES[size]
    model, _, _, kwargs = w.build(data, size)
    loader = _loader(Utterances16(data), cfg, size, pad_utterances, workers=cfg["workers"])
    return model, loader, None, kwargs, [_boost(size, SpeechFeatures(), auto_workers=False)]


class AugmentedUint8(Dataset):
    """The ViT project's own augmentation in the workers (RandomResizedCrop, flip, RandAugment: Pillow operations
    on uint8 pixels), shipped as uint8 CHW: ToTensor's float conversion and Normalize move to the GPU (4x fewer
    bytes through shared memory, pinning and the copy)."""

    def __init__(self, root: Path, crop: int) -> None:
        import vit_finetune as w

        self.folder = w.Folder(root, crop)
        if self.folder.transform is not None:  # timm's transform: its PIL part, without ToTensor and Normalize
            kept = [t for t in self.folder.transform.transforms
                    if "ToTensor" not in type(t).__name__ and "Normalize" not in type(t).__name__]  # fmt: skip
            self.folder.transform = type(self.folder.transform)(kept)

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int):
        import vit_finetune as w

        path, label = self.folder.samples[i]
        img = Image.open(path).convert("RGB")
        if self.folder.transform is not None:
            img = self.folder.transform(img)
        else:  # the project's Pillow version of timm's transform, as its Folder runs it, before ToTensor
            img = w.augment(img, self.folder.crop)
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), label


def vit_finetune(data: Path, size: str):
    """uint8 images from the workers, normalized on the GPU (the advice's first fix); the augmentation stays."""
    import vit_finetune as w

    cfg = w.SIZES[size]
    model, _, _, kwargs = w.build(data, size)
    loader = _loader(AugmentedUint8(data, cfg["crop"]), cfg, size, workers=cfg["workers"])
    return model, loader, None, kwargs, [GPUBoost(normalize=(MEAN, STD), auto_workers=False)]


BEST = {"jpeg_classification": jpeg_classification, "photos_hr": photos_hr, "segmentation": segmentation,
        "audio": audio, "tabular": tabular, "short_epochs": short_epochs, "speech_ctc": speech_ctc,
        "vit_finetune": vit_finetune}  # fmt: skip
