"""Pack a class-per-folder image tree into one LMDB file, verify it, and train from it.

    python examples/lmdb_pack_and_train.py --src data/train
    python examples/lmdb_pack_and_train.py                     # generated demo images
"""

import argparse
import tempfile

import torch
from lightning.pytorch import Trainer

from lightning_gpu_boost.callbacks import StreamPrefetch
from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.core.lmdb import pack_image_folder, verify
from lightning_gpu_boost.datamodules import LMDBDataModule
from lightning_gpu_boost.models import ImageClassifier

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--src")
    parser.add_argument("--dst")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp()
    src = args.src or str(make_jpeg_folder(f"{tmp}/train", n=48, num_classes=3, progress=False))
    pack = pack_image_folder(src, args.dst or f"{tmp}/train.lmdb")
    print(verify(pack))
    gpu = torch.cuda.is_available()
    datamodule = LMDBDataModule(str(pack), image_size=224 if gpu else 64, batch_size=256 if gpu else 8,
                                val_split=0.25)  # fmt: skip
    trainer = Trainer(max_epochs=1, precision="bf16-mixed" if gpu else "32-true", logger=False,
                      enable_checkpointing=False, callbacks=[StreamPrefetch()])  # fmt: skip
    trainer.fit(ImageClassifier("resnet50" if gpu else "small_cnn", num_classes=datamodule.num_classes), datamodule)
