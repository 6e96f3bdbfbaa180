"""DALIDataModule on an ImageNet-style tree: DALI decodes (on its CPU threads or, with ``--decoder mixed``, on the
GPU) and resizes, flips and normalizes on the GPU (a CPU pipeline without one).

    python examples/dali_imagenet_style.py [--root data/train] [--val-root data/val] [--epochs 1] [--decoder auto]

Without ``--root`` it trains on a small generated JPEG tree. Needs the ``dali`` extra (``dali-cuda13`` for CUDA 13).
"""

from __future__ import annotations

import argparse
import tempfile

import lightning.pytorch as pl
import torch

from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.datamodules import DALIDataModule
from lightning_gpu_boost.models import ImageClassifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", help="class-per-folder training tree, or an LMDB pack")
    parser.add_argument("--val-root")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--decoder", choices=["auto", "mixed", "cpu"], default="auto", help="DALIDataModule's decoder_device")
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    root = args.root or str(make_jpeg_folder(tempfile.mkdtemp(), n=48, num_classes=4, size_range=(64, 96, 64, 96),
                                             progress=False))  # fmt: skip
    datamodule = DALIDataModule(
        root, val_root=args.val_root or (None if args.root else root), batch_size=256 if gpu and args.root else 16,
        image_size=224 if args.root else 32, dtype="bfloat16" if gpu else "float32", channels_last=gpu,
        decoder_device=args.decoder,
    )  # fmt: skip
    model = ImageClassifier("resnet50" if gpu and args.root else "small_cnn", num_classes=datamodule.num_classes,
                            channels_last=gpu)  # fmt: skip
    trainer = pl.Trainer(max_epochs=args.epochs, precision="bf16-mixed" if gpu else "32-true", logger=False,
                         enable_checkpointing=False)  # fmt: skip
    trainer.fit(model, datamodule)


if __name__ == "__main__":
    main()
