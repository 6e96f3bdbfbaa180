"""Speech recognition trained with CTC, as torchaudio's and ESPnet's recipes write it: 16 kHz WAV utterances read
with soundfile (the stdlib ``wave`` where it is missing), Kaldi-style 80-band log-mel filterbanks with dither and
pre-emphasis (``torchaudio.compliance.kaldi.fbank`` where installed, the same steps with ``torch.stft`` otherwise),
per-utterance mean/variance normalization, SpecAugment (two frequency and two time masks), character transcripts;
padded batches with lengths; a conv subsampling front-end, a BiLSTM encoder and CTC loss; 4 workers.

Expected: the loader limits it (filterbanks and SpecAugment per utterance cost more CPU than the step's GPU time).
"""

from __future__ import annotations

import math
import random
import wave
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

EXPECTED = {"cpu": "data-bound", "gpu": "data-bound"}
SIZES = {
    "cpu": {"utterances": 192, "seconds": (4.0, 8.0), "batch": 8, "workers": 1, "dim": 4, "layers": 0, "steps": 16},
    "gpu": {"utterances": 6144, "seconds": (3.0, 12.0), "batch": 32, "workers": 4, "dim": 320, "layers": 3,
            "steps": 50},
}  # fmt: skip
RATE, MELS, FRAME, SHIFT, N_FFT = 16_000, 80, 400, 160, 512
ALPHABET = " abcdefghijklmnopqrstuvwxyz'"  # CTC's blank is 0, characters are 1..28


def read_wav(path: Path) -> np.ndarray:
    try:
        import soundfile

        return soundfile.read(path, dtype="float32")[0]
    except ImportError:
        with wave.open(str(path), "rb") as f:
            return np.frombuffer(f.readframes(f.getnframes()), dtype="<i2").astype(np.float32) / 32768


def _mel_banks() -> torch.Tensor:
    def mel(f):
        return 1127 * np.log(1 + f / 700)

    edges = np.linspace(mel(20), mel(RATE / 2), MELS + 2)
    freqs = mel(np.arange(N_FFT // 2 + 1) * RATE / N_FFT)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    banks = np.maximum(0, np.minimum((freqs - lo) / (mid - lo), (hi - freqs) / (hi - mid)))
    return torch.from_numpy(banks.astype(np.float32))


def fbank(wav: torch.Tensor, banks: torch.Tensor) -> torch.Tensor:
    """Kaldi's fbank: frames of 25 ms every 10 ms, dither, DC removal, pre-emphasis 0.97, Povey window, power
    spectrum, log mel energies (torchaudio.compliance.kaldi.fbank where installed)."""
    try:
        import torchaudio.compliance.kaldi as kaldi

        return kaldi.fbank(wav[None] * 32768, num_mel_bins=MELS, sample_frequency=RATE, dither=1.0)
    except ImportError:
        pass
    frames = wav.unfold(0, FRAME, SHIFT) * 32768
    frames = frames + torch.randn_like(frames)  # dither
    frames = frames - frames.mean(1, keepdim=True)
    frames = torch.cat([frames[:, :1] * 0.03, frames[:, 1:] - 0.97 * frames[:, :-1]], 1)
    frames = frames * torch.hann_window(FRAME, periodic=False).pow(0.85)
    power = torch.fft.rfft(frames, N_FFT).abs().pow(2)
    return torch.log((power @ banks.T).clamp(min=1.1920929e-07))


def spec_augment(x: torch.Tensor, freq_masks: int = 2, f: int = 27, time_masks: int = 2, t: int = 40) -> torch.Tensor:
    x = x.clone()
    for _ in range(freq_masks):
        w = random.randint(0, f)
        start = random.randint(0, max(0, x.shape[1] - w))
        x[:, start : start + w] = 0
    for _ in range(time_masks):
        w = random.randint(0, min(t, x.shape[0] // 5))
        start = random.randint(0, max(0, x.shape[0] - w))
        x[start : start + w] = 0
    return x


class Utterances(Dataset):
    def __init__(self, root: Path) -> None:
        self.files = sorted(Path(root).glob("*.wav"))
        self.banks = _mel_banks()

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path = self.files[i]
        feats = fbank(torch.from_numpy(read_wav(path)), self.banks)
        feats = (feats - feats.mean(0)) / (feats.std(0) + 1e-5)  # per-utterance CMVN
        text = path.with_suffix(".txt").read_text().strip()
        return spec_augment(feats), torch.tensor([ALPHABET.index(c) + 1 for c in text])


def collate(batch):
    feats, labels = zip(*batch, strict=True)
    return (nn.utils.rnn.pad_sequence(feats, batch_first=True), torch.tensor([len(f) for f in feats]),
            nn.utils.rnn.pad_sequence(labels, batch_first=True), torch.tensor([len(t) for t in labels]))  # fmt: skip


class CTCModel(pl.LightningModule):
    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.subsample = nn.Sequential(nn.Conv2d(1, dim // 4 or 1, 3, 2), nn.ReLU(), nn.Conv2d(dim // 4 or 1, dim // 4 or 1, 3, 2), nn.ReLU())  # fmt: skip
        width = (dim // 4 or 1) * (((MELS - 1) // 2 - 1) // 2)
        self.proj = nn.Linear(width, dim)
        self.lstm = nn.LSTM(dim, dim // 2, layers, batch_first=True, bidirectional=True) if layers else None
        self.out = nn.Linear(dim, len(ALPHABET) + 1)

    def training_step(self, batch, batch_idx):
        feats, lengths, labels, label_lengths = batch
        h = self.subsample(feats[:, None])  # N x C x T/4 x F/4
        h = self.proj(h.permute(0, 2, 1, 3).flatten(2))
        if self.lstm is not None:
            h = self.lstm(h)[0]
        frames = ((lengths - 1) // 2 - 1) // 2
        logp = self.out(h).log_softmax(-1).transpose(0, 1).float()
        loss = F.ctc_loss(logp, labels, frames.clamp(max=logp.shape[0]), label_lengths, zero_infinity=True)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _utterance(job: tuple[Path, int, tuple[float, float]]) -> None:
    path, seed, seconds = job
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list(ALPHABET[1:-1]), rng.integers(2, 8))) for _ in range(rng.integers(3, 12))]
    t = np.arange(int(rng.uniform(*seconds) * RATE)) / RATE
    voice = sum(0.1 * np.sin(2 * math.pi * rng.uniform(100, 3000) * t) for _ in range(3)) + rng.normal(0, 0.05, t.shape)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(RATE)
        f.writeframes((np.clip(voice, -1, 1) * 32767).astype("<i2").tobytes())
    path.with_suffix(".txt").write_text(" ".join(words))


def prepare(root: Path, size: str) -> Path:
    from _images import write_once

    cfg = SIZES[size]
    out = Path(root) / f"utterances-{cfg['utterances']}"
    jobs = [(out / f"utt_{i:05d}.wav", i, cfg["seconds"]) for i in range(cfg["utterances"])]
    return write_once(out, _utterance, lambda: jobs)


def build(data: Path, size: str):
    cfg = SIZES[size]
    loader = DataLoader(Utterances(data), batch_size=cfg["batch"], shuffle=True, num_workers=cfg["workers"],
                        collate_fn=collate, pin_memory=size == "gpu")  # fmt: skip
    return CTCModel(cfg["dim"], cfg["layers"]), loader, None, {"max_steps": cfg["steps"]}
