"""Train on a class-per-folder image tree with ImageFolderDataModule (uint8 batches, fast decode).

    python examples/image_folder.py --train data/train --val data/val
    python examples/image_folder.py                               # generated demo images, 25 % held out
"""

import argparse
import tempfile

import torch
from lightning.pytorch import Trainer

from lightning_gpu_boost.callbacks import StreamPrefetch
from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.datamodules import ImageFolderDataModule
from lightning_gpu_boost.models import ImageClassifier

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--train")
    parser.add_argument("--val")
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    train = args.train or str(make_jpeg_folder(tempfile.mkdtemp(), n=48, num_classes=3, progress=False))
    datamodule = ImageFolderDataModule(
        train,
        val_root=args.val,
        val_split=0.0 if args.val or args.train else 0.25,
        image_size=224 if gpu else 64,
        batch_size=256 if gpu else 8,
    )
    # StreamPrefetch: on a GPU, side-stream copy + normalization; on a CPU the same values, normalized on the CPU
    trainer = Trainer(max_epochs=args.epochs, precision="bf16-mixed" if gpu else "32-true", logger=False,
                      enable_checkpointing=False, callbacks=[StreamPrefetch()])  # fmt: skip
    trainer.fit(ImageClassifier("resnet50" if gpu else "small_cnn", num_classes=datamodule.num_classes), datamodule)
    print("validation loss:", float(trainer.callback_metrics["val_loss"]))
