"""The whole change to an existing Lightning script: a DataModule that emits uint8 batches and one callback.

    python examples/quickstart.py --data /path/to/train     # class-per-folder images
    python examples/quickstart.py                           # generated demo images
"""

import argparse
import tempfile

import torch
from lightning.pytorch import Trainer

from lightning_gpu_boost.callbacks import StreamPrefetch
from lightning_gpu_boost.core.images import IMAGENET_MEAN, IMAGENET_STD, make_jpeg_folder
from lightning_gpu_boost.datamodules import ImageFolderDataModule
from lightning_gpu_boost.models import ImageClassifier

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", help="class-per-folder training images (default: generated)")
    parser.add_argument("--max-steps", type=int, default=4)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    root = args.data or make_jpeg_folder(tempfile.mkdtemp(), n=64, num_classes=4, progress=False)
    datamodule = ImageFolderDataModule(str(root), image_size=224 if gpu else 64, batch_size=256 if gpu else 16)
    model = ImageClassifier("resnet50" if gpu else "small_cnn", num_classes=datamodule.num_classes)

    trainer = Trainer(
        callbacks=[StreamPrefetch(normalize=(IMAGENET_MEAN, IMAGENET_STD), channels_last=gpu)],  # <- the change
        precision="bf16-mixed" if gpu else "32-true",
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(model, datamodule=datamodule)
