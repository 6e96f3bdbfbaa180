"""Ask the doctor where a training run's time goes: a JPEG DataModule at num_workers=0 and a small CNN.

    python examples/doctor.py

The same from the command line, for your own classes:
    lightning-gpu-boost doctor --data my_project.MyDataModule --model my_project.MyModel
"""

from __future__ import annotations

import sys
import tempfile

from lightning_gpu_boost.core.images import make_jpeg_folder
from lightning_gpu_boost.datamodules import ImageFolderDataModule
from lightning_gpu_boost.doctor import diagnose
from lightning_gpu_boost.models import ImageClassifier


def main() -> None:
    root = make_jpeg_folder(tempfile.mkdtemp(), n=64, num_classes=4, progress=False)
    datamodule = ImageFolderDataModule(str(root), image_size=64, batch_size=16, num_workers=0)
    report = diagnose(datamodule, ImageClassifier("small_cnn", num_classes=4), budget_s=6, steps=5,
                      progress=lambda line: print(f"doctor: {line}", file=sys.stderr))  # fmt: skip
    print(report.format())


if __name__ == "__main__":
    main()
