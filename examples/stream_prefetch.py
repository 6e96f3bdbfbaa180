"""StreamPrefetch on a transfer-bound step: float32 batches vs uint8 batches normalized on the GPU.

    python examples/stream_prefetch.py            # on a GPU; on a CPU the callback is a no-op
"""

import argparse
import time

import torch
from lightning.pytorch import Callback, Trainer
from torch.utils.data import DataLoader, TensorDataset

from lightning_gpu_boost.callbacks import StreamPrefetch
from lightning_gpu_boost.core.images import IMAGENET_MEAN, IMAGENET_STD
from lightning_gpu_boost.models import ImageClassifier


class Timer(Callback):
    def on_train_start(self, trainer, pl_module):
        self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        print(f"{trainer.global_step} steps in {time.perf_counter() - self.start:.2f} s")


def run(images: torch.Tensor, callbacks: list, steps: int) -> None:
    data = TensorDataset(images, torch.randint(0, 10, (len(images),)))
    gpu = torch.cuda.is_available()
    trainer = Trainer(
        callbacks=[*callbacks, Timer()], max_steps=steps, precision="bf16-mixed" if gpu else "32-true",
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(ImageClassifier("two_conv", num_classes=10, width=16), DataLoader(data, batch_size=64, pin_memory=gpu))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--size", type=int, default=224 if torch.cuda.is_available() else 32)
    args = parser.parse_args()
    uint8 = torch.randint(0, 256, (640, 3, args.size, args.size), dtype=torch.uint8)
    floats = uint8.float().div_(255)

    print("plain Lightning, float32 batches:")
    run(floats, [], args.steps)
    print("StreamPrefetch, float32 batches:")
    run(floats, [StreamPrefetch()], args.steps)
    print("StreamPrefetch, uint8 batches normalized on the GPU:")
    run(uint8, [StreamPrefetch(normalize=(IMAGENET_MEAN, IMAGENET_STD))], args.steps)
