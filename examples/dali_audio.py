"""DALI reads and decodes audio clips; LogMel turns them into log-mel features on the GPU, one batch ahead
(docs/dali.md, "Audio clips"). Runs on a CPU with DALI's CPU pipeline."""

import functools
import tempfile
import wave
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch

from lightning_gpu_boost.callbacks import StreamPrefetch
from lightning_gpu_boost.core.dali import DALILoader, FileListSource, audio_graph
from lightning_gpu_boost.core.gpu_transforms import LogMel

root = Path(tempfile.mkdtemp())
for k in range(8):  # eight 0.2-0.4 s clips at 16 kHz
    with wave.open(str(root / f"clip_{k}.wav"), "wb") as f:
        f.setnchannels(1), f.setsampwidth(2), f.setframerate(16_000)
        f.writeframes((np.sin(np.arange(3200 + 400 * k) * 0.05) * 8000).astype("<i2").tobytes())
files = sorted(root.glob("*.wav"))
gpu = torch.cuda.is_available()
loader = DALILoader(FileListSource(files, [k % 2 for k in range(8)]), functools.partial(audio_graph, gpu=gpu),
                    batch_size=4, device_id=torch.cuda.current_device() if gpu else None, num_threads=2)


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(80, 2)

    def training_step(self, batch, batch_idx):
        features, frames, labels = batch  # (N, frames padded to 16, 80), each clip's frames, labels
        pooled = features.mean(1)
        return torch.nn.functional.cross_entropy(self.head(pooled), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


mel = LogMel(source_rate=16_000, rate=16_000, pad_to=16)
trainer = pl.Trainer(max_epochs=1, accelerator="gpu" if gpu else "cpu", devices=1, logger=False,
                     enable_checkpointing=False, callbacks=[StreamPrefetch(cpu_lookahead=True, transform=mel)])
trainer.fit(Classifier(), loader)
loader.close()
